// The serving engine's paged cache (serve/engine.c) on a tiny hybrid built
// here (attention, MLA, GDN, Mamba-2), driven in-process: a request that can
// never fit the pool is refused; two long requests that the pool cannot hold
// together both finish, the newer one preempted (its pages freed, prefilled
// again with its answer so far, its stream going on), and every token of
// both streams is what greedy decoding of its sequence gives; the prefix
// cache shares its pages with the requests that restore them; decode tokens
// ride in the prefill chunks of the same turn, one forward a turn, every
// answer the one its request gets alone; a token budget per turn
// (max_batched_tokens) bounds every forward, cuts and defers chunks (oldest
// request first), never a decode token, and changes no answer; requests that
// sample (temperature, top-p, their own seeds), drawn side by side on
// several threads, each get the tokens they get alone; greedy decode steps
// take their tokens from the argmax on the device, the tokens the host's
// argmax of the copied logits gives.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "serve/engine.h"
#include "testutil.h"

typedef struct {
    model_t m;
    srv_metrics_t met;
    srv_engine_t *e;
    int left; // requests not done yet; the last one stops the engine
} bench_t;

typedef struct {
    bench_t *b;
    int32_t tok[1024];
    uint64_t turn[1024]; // the engine's turns before the one that gave tok[i] (on_token_turn)
    int n;
    srv_done_t done;
    int has_done;
    sampler_logprob_t *lp; // test_logprobs: each token's (NULL: the request asked for none)
    int lp_null;           // tokens that came without log-probabilities
} stream_t;

static int on_token(void *user, int32_t id, const sampler_logprob_t *lp) {
    stream_t *s = user;
    assert_true(s->n < 1024);
    if (s->lp && lp) s->lp[s->n] = *lp;
    s->lp_null += lp == NULL;
    s->tok[s->n++] = id;
    return 0;
}

static void on_done(void *user, const srv_done_t *d) {
    stream_t *s = user;
    s->done = *d, s->has_done = 1;
    if (--s->b->left == 0) srv_engine_shutdown(s->b->e);
}

static arch_t tiny_hybrid(void) {
    const layer_kind_t plan[6] = {LAYER_MLA, LAYER_M2, LAYER_ATTN, LAYER_GDN, LAYER_MLA, LAYER_M2};
    return tu_tiny_arch(plan, 6, 0, 0);
}

// An engine over the tiny model whose pool holds `pages` pages, with a token
// budget per turn (0: none) and `threads` OpenMP threads (0: the default).
static void bench_open_cfg(bench_t *b, int pages, int max_seqs, int64_t prefix_bytes, int budget, int threads) {
    memset(b, 0, sizeof *b);
    arch_t a = tiny_hybrid();
    assert_int_equal(model_create(&b->m, &a, tu_cpu()), 0);
    float *w = tu_params(&b->m.pt, 11, 0.3f);
    memcpy(b->m.w, w, (size_t)b->m.pt.total * sizeof(float)); // CPU backend: act == float
    free(w);
    srv_metrics_init(&b->met);
    srv_engine_cfg_t cfg = {.max_seqs = max_seqs,
                            .queue = 8,
                            .ctx = 1024,
                            .chunk = 64,
                            .prefix_bytes = prefix_bytes,
                            .prefix_block = 128,
                            .max_batched_tokens = budget,
                            .threads = threads,
                            .cache_budget = (int64_t)max_seqs * model_snapshot_fixed_bytes(&b->m) +
                                            (int64_t)pages * model_page_bytes(&b->m)};
    assert_int_equal(srv_pool_pages(&b->m, &cfg), pages);
    assert_int_equal(srv_engine_create(&b->e, &b->m, &cfg, &b->met), 0);
    assert_int_equal(srv_engine_pages(b->e), pages);
}

static void bench_open(bench_t *b, int pages, int max_seqs, int64_t prefix_bytes) {
    bench_open_cfg(b, pages, max_seqs, prefix_bytes, 0, 0);
}

static void bench_close(bench_t *b) {
    srv_engine_free(b->e);
    srv_metrics_free(&b->met);
    model_free(&b->m);
}

// A request sampling by smp whose tokens go to s through tok (on_token, or
// one that does more).
static void submit_sampled(bench_t *b, stream_t *s, const int32_t *prompt, int n_prompt, int max_new, sampler_cfg_t smp,
                           int (*tok)(void *, int32_t, const sampler_logprob_t *)) {
    memset(s, 0, sizeof *s);
    s->b = b;
    srv_submit_t q = {.prompt = prompt,
                      .n_prompt = n_prompt,
                      .max_new = max_new,
                      .sampler = smp,
                      .on_token = tok,
                      .on_done = on_done,
                      .user = s};
    uint64_t id;
    assert_int_equal(srv_engine_submit(b->e, &q, &id), 0);
    b->left++;
}

// A greedy request whose tokens go to s through tok.
static void submit_with(bench_t *b, stream_t *s, const int32_t *prompt, int n_prompt, int max_new,
                        int (*tok)(void *, int32_t, const sampler_logprob_t *)) {
    submit_sampled(b, s, prompt, n_prompt, max_new, (sampler_cfg_t){.temperature = 0, .top_p = 1}, tok);
}

static void submit(bench_t *b, stream_t *s, const int32_t *prompt, int n_prompt, int max_new) {
    submit_with(b, s, prompt, n_prompt, max_new, on_token);
}

// Every generated token is the greedy choice given the prompt and the tokens
// before it: the logits of one forward over the whole sequence, the token's
// within 1e-3 of the largest (the engine's prefill and decode steps round
// apart from this forward, and from each other; a lost, repeated or wrong
// token is far off). Returns the worst gap.
static double check_greedy(model_t *m, const int32_t *prompt, int n_prompt, const stream_t *s) {
    int T = n_prompt + s->n, V = m->a.V;
    int32_t *ids = malloc(sizeof(int32_t) * T);
    memcpy(ids, prompt, sizeof(int32_t) * n_prompt);
    memcpy(ids + n_prompt, s->tok, sizeof(int32_t) * s->n);
    float *lg = malloc(sizeof(float) * (size_t)T * V);
    model_run_t r;
    assert_int_equal(model_run_create(&r, m, 64u << 20), 0);
    assert_int_equal(model_logits_all(&r, ids, 1, T, lg), 0);
    double worst = 0;
    for (int j = 0; j < s->n; j++) {
        const float *l = lg + (size_t)(n_prompt + j - 1) * V;
        double gap = l[sampler_argmax(l, V)] - l[s->tok[j]];
        if (gap > worst) worst = gap;
    }
    model_run_free(&r);
    free(ids), free(lg);
    return worst;
}

// A pool of 3 pages (256 tokens each) and two requests of 10 + 400 tokens
// (2 pages each): both start, and when both need their second page the
// newer is preempted, waits for the older to finish and resumes. A request
// of more pages than the pool is refused at submit.
static void test_preemption(void **state) {
    bench_t b;
    bench_open(&b, 3, 2, 0);
    int32_t pa[10], pb[10], big[10];
    for (int i = 0; i < 10; i++)
        pa[i] = (i * 7 + 3) % b.m.a.V, pb[i] = (i * 5 + 1) % b.m.a.V, big[i] = i;
    srv_submit_t q = {.prompt = big, .n_prompt = 10, .max_new = 800, .sampler = {.top_p = 1}};
    uint64_t id;
    assert_int_equal(srv_engine_submit(b.e, &q, &id), ERR_INPUT);
    printf("  refused: %s\n", err_msg());
    assert_non_null(strstr(err_msg(), "need 4 cache pages of 256 tokens"));
    stream_t sa, sb;
    submit(&b, &sa, pa, 10, 400);
    submit(&b, &sb, pb, 10, 400);
    srv_engine_run(b.e);
    assert_true(sa.has_done && sb.has_done);
    printf("  A: %d tokens (finish %d), B: %d tokens (finish %d); preemptions %llu; pages free %lld of %lld\n", sa.n,
           (int)sa.done.finish, sb.n, (int)sb.done.finish, (unsigned long long)b.met.preempted,
           (long long)b.met.pages_free, (long long)b.met.pages_total);
    assert_int_equal(sa.done.finish, SRV_FINISH_LENGTH);
    assert_int_equal(sb.done.finish, SRV_FINISH_LENGTH);
    assert_int_equal(sa.n, 400);
    assert_int_equal(sb.n, 400);
    assert_int_equal(sb.done.n_new, 400);
    assert_int_equal(sb.done.n_prompt, 10);
    assert_true(b.met.preempted >= 1);
    assert_int_equal(b.met.pages_free, 3);
    assert_int_equal(b.met.prompt_tokens, 20); // a resumed prompt is not counted again
    double ga = check_greedy(&b.m, pa, 10, &sa), gb = check_greedy(&b.m, pb, 10, &sb);
    printf("  worst gap to the greedy token: A %.2e, B %.2e\n", ga, gb);
    assert_true(ga < 1e-3 && gb < 1e-3);
    bench_close(&b);
}

// The prefix cache over the pool: a prompt of 300 tokens, then (submitted
// when the first is done) the same again: the second restores the first's
// pages up to its last boundary (256, the fixed states' block) and prefills
// the rest into its own copy of the partial page, and answers token for
// token as the first did (the same chunks from 256 on). The entry keeps its
// two pages after both are done.
static const int32_t *again_prompt;
static stream_t *again_stream;

static void on_done_again(void *user, const srv_done_t *d) {
    stream_t *s = user;
    if (again_stream) {
        stream_t *n = again_stream;
        again_stream = NULL;
        submit(s->b, n, again_prompt, 300, 20);
    }
    on_done(user, d);
}

static void test_prefix_pages(void **state) {
    bench_t b;
    bench_open(&b, 6, 2, 1 << 20);
    int32_t p[300];
    for (int i = 0; i < 300; i++)
        p[i] = (i * 11 + 2) % b.m.a.V;
    stream_t s1, s2;
    again_prompt = p, again_stream = &s2;
    memset(&s1, 0, sizeof s1);
    s1.b = &b;
    srv_submit_t q = {.prompt = p,
                      .n_prompt = 300,
                      .max_new = 20,
                      .sampler = {.temperature = 0, .top_p = 1},
                      .on_token = on_token,
                      .on_done = on_done_again,
                      .user = &s1};
    uint64_t id;
    assert_int_equal(srv_engine_submit(b.e, &q, &id), 0);
    b.left++;
    srv_engine_run(b.e);
    assert_true(s1.has_done && s2.has_done);
    printf("  prefix: hits %llu, reused %llu tokens, entries %lld, pages free %lld of %lld\n",
           (unsigned long long)b.met.prefix.hits, (unsigned long long)b.met.prefix.reused_tokens,
           (long long)b.met.prefix.entries, (long long)b.met.pages_free, (long long)b.met.pages_total);
    assert_int_equal(s1.n, 20);
    assert_int_equal(s2.n, 20);
    assert_memory_equal(s1.tok, s2.tok, sizeof(int32_t) * 20);
    assert_int_equal(b.met.prefix.hits, 1);
    assert_int_equal(b.met.prefix.reused_tokens, 256);
    assert_int_equal(b.met.prefix.entries, 1);
    // its fixed states at the block boundaries 128 and 256 and at the prompt's end, 300
    assert_int_equal(b.met.prefix.snapshots, 3);
    assert_int_equal(b.met.prefix.snapshot_bytes, 3 * model_snapshot_fixed_bytes(&b.m));
    assert_int_equal(b.met.pages_free, 6 - 2); // the entry's two pages
    bench_close(&b);
}

// Decode rows riding in the prefill: requests at different stages overlap,
// and every turn runs one forward. A (10-token prompt), B (300 tokens: five
// chunks of 64) and C (a one-token prompt, a fresh state stepping in the
// prefill) start together; while B is in its prompt, A and C decode, their
// tokens riding in B's chunks; D (130 tokens) arrives after A's 12th token
// and prefills while the others decode. Each answer (greedy) is token for
// token the one the request gets alone in an engine (its decode steps
// then model_step_batch's; the riding rows round apart from a decode step
// in the last bits only: test_state.c test_decode_rows_in_prefill), and
// every token the greedy choice of a forward over its whole sequence (gap
// below 1e-3 as in test_preemption). The engine's counts: one forward a
// turn, and forwards that carried decode tokens.
enum { OV_N = 4 };
static int32_t ov_prompt[OV_N][300];
static const int ov_len[OV_N] = {10, 300, 1, 130}, ov_new[OV_N] = {40, 20, 30, 10};
static stream_t *ov_later; // D, submitted from A's 12th token

static int on_token_ov(void *user, int32_t id, const sampler_logprob_t *lp) {
    stream_t *s = user;
    on_token(user, id, lp);
    if (s->n == 12 && ov_later) {
        stream_t *d = ov_later;
        ov_later = NULL;
        submit(s->b, d, ov_prompt[3], ov_len[3], ov_new[3]);
    }
    return 0;
}

// Request i alone in an engine of its own.
static void ov_alone(int i, stream_t *s) {
    bench_t b;
    bench_open(&b, 12, 4, 0);
    submit(&b, s, ov_prompt[i], ov_len[i], ov_new[i]);
    srv_engine_run(b.e);
    assert_true(s->has_done);
    srv_engine_stats_t st = srv_engine_stats(b.e);
    assert_int_equal(st.mixed, 0);
    bench_close(&b);
}

static void test_decode_rides_in_prefill(void **state) {
    bench_t b;
    bench_open(&b, 12, 4, 0);
    int V = b.m.a.V;
    for (int i = 0; i < OV_N; i++)
        for (int t = 0; t < ov_len[i]; t++)
            ov_prompt[i][t] = (t * (7 + 2 * i) + 3 * i + 1) % V;
    stream_t s[OV_N];
    submit_with(&b, &s[0], ov_prompt[0], ov_len[0], ov_new[0], on_token_ov);
    submit(&b, &s[1], ov_prompt[1], ov_len[1], ov_new[1]);
    submit(&b, &s[2], ov_prompt[2], ov_len[2], ov_new[2]);
    ov_later = &s[3];
    // a token the model does not have is refused at submit (it would fail the forward of the requests beside it)
    int32_t bad[2] = {1, V};
    srv_submit_t qb = {.prompt = bad, .n_prompt = 2, .max_new = 1, .sampler = {.top_p = 1}};
    uint64_t id;
    assert_int_equal(srv_engine_submit(b.e, &qb, &id), ERR_INPUT);
    srv_engine_run(b.e);
    srv_engine_stats_t st = srv_engine_stats(b.e);
    printf("  together: %llu turns, %llu forwards, %llu of them with %llu decode tokens riding in the prefill\n",
           (unsigned long long)st.turns, (unsigned long long)st.forwards, (unsigned long long)st.mixed,
           (unsigned long long)st.rode);
    for (int i = 0; i < OV_N; i++) {
        assert_true(s[i].has_done);
        assert_int_equal(s[i].done.finish, SRV_FINISH_LENGTH);
        assert_int_equal(s[i].n, ov_new[i]);
        stream_t alone;
        ov_alone(i, &alone);
        assert_int_equal(alone.n, ov_new[i]);
        assert_memory_equal(s[i].tok, alone.tok, sizeof(int32_t) * ov_new[i]);
        double gap = check_greedy(&b.m, ov_prompt[i], ov_len[i], &s[i]);
        printf("  request %c: %d tokens, the same alone; worst gap to the greedy token %.2e\n", 'A' + i, s[i].n, gap);
        assert_true(gap < 1e-3);
    }
    // one forward a turn; B's chunks 2 to 5 carried A's and C's tokens, D's
    // chunks the others'
    assert_int_equal(st.forwards, st.turns);
    assert_true(st.mixed >= 4 + 3);
    assert_true(st.rode >= 2 * 4 + 3 * 2);
    assert_int_equal(b.met.gen_tokens, 40 + 20 + 30 + 10);
    assert_int_equal(b.met.pages_free, 12);
    bench_close(&b);
}

// The token budget per turn (max_batched_tokens), chunk 64, four slots: A
// (a 5-token prompt, then a long answer), B and C (200 and 150 tokens), D (a
// one-token prompt), and E (100 tokens) and F (B's prompt again) waiting for
// a slot, submitted together. Budget 16 (at least max_seqs), with the
// prefix cache: the decode tokens count first, the chunks of the others,
// oldest first, take what is left, so no forward carries more than 16
// tokens; B's chunks are cut, C waits while B's prompt takes the budget (D's
// one token may come from what a chunk that ends on its boundary leaves);
// B's cut chunks still end on the prefix cache's boundary 128, so F restores
// 128 tokens. Budget 2, no prefix cache: with two requests decoding nothing
// is left, and the oldest prompt still gets one token a turn (a forward of
// 3, at most max_seqs). Either way no decode token is ever deferred (a
// request's tokens come in consecutive turns), the forwards carry exactly
// the prompts (less what was restored) and the fed-back tokens, and every
// answer (greedy) is token for token the one its request gets alone with no
// budget.
enum { BU_N = 6 };
static int32_t bu_prompt[BU_N][200];
static const int bu_len[BU_N] = {5, 200, 150, 1, 100, 200}, bu_new[BU_N] = {300, 10, 12, 30, 8, 10};

static int on_token_turn(void *user, int32_t id, const sampler_logprob_t *lp) {
    stream_t *s = user;
    assert_true(s->n < 1024);
    s->turn[s->n] = srv_engine_stats(s->b->e).turns; // on the engine thread, between its locks
    return on_token(user, id, lp);
}

static void test_token_budget(void **state) {
    static const int budgets[2] = {16, 2};
    stream_t alone[BU_N];
    for (int k = 0; k < 2; k++) {
        const int budget = budgets[k], max_seqs = 4;
        bench_t b;
        const int64_t prefix = k == 0 ? 4 << 20 : 0;
        bench_open_cfg(&b, 16, max_seqs, prefix, budget, 0);
        int V = b.m.a.V;
        for (int i = 0; i < BU_N; i++)
            for (int t = 0; t < bu_len[i]; t++)
                bu_prompt[i][t] = i == 5 ? bu_prompt[1][t] : (t * (5 + 2 * i) + 7 * i + 2) % V;
        stream_t s[BU_N];
        for (int i = 0; i < BU_N; i++)
            submit_with(&b, &s[i], bu_prompt[i], bu_len[i], bu_new[i], on_token_turn);
        srv_engine_run(b.e);
        srv_engine_stats_t st = srv_engine_stats(b.e);
        printf("  budget %d: %llu turns, %llu tokens, the largest forward %llu; %llu chunks cut, %llu deferred; %llu "
               "decode tokens rode in %llu forwards\n",
               budget, (unsigned long long)st.turns, (unsigned long long)st.tokens, (unsigned long long)st.max_tokens,
               (unsigned long long)st.cut, (unsigned long long)st.deferred, (unsigned long long)st.rode,
               (unsigned long long)st.mixed);
        printf("  prefix cache: %llu hits, %llu tokens restored\n", (unsigned long long)b.met.prefix.hits,
               (unsigned long long)b.met.prefix.reused_tokens);
        assert_int_equal(b.met.prefix.reused_tokens, prefix ? 128 : 0); // F: B's prompt to its boundary 128
        uint64_t fed = 0;
        for (int i = 0; i < BU_N; i++) {
            assert_true(s[i].has_done);
            assert_int_equal(s[i].done.finish, SRV_FINISH_LENGTH);
            assert_int_equal(s[i].n, bu_new[i]);
            for (int j = 1; j < s[i].n; j++) // never deferred: one token a turn once decoding
                assert_int_equal(s[i].turn[j], s[i].turn[j - 1] + 1);
            if (k == 0) {
                bench_t one;
                bench_open(&one, 16, max_seqs, 0);
                submit(&one, &alone[i], bu_prompt[i], bu_len[i], bu_new[i]);
                srv_engine_run(one.e);
                assert_true(alone[i].has_done);
                bench_close(&one);
            }
            assert_int_equal(alone[i].n, bu_new[i]);
            assert_memory_equal(s[i].tok, alone[i].tok, sizeof(int32_t) * bu_new[i]);
            printf("  request %c: first token in turn %llu, %d tokens, the same alone\n", 'A' + i,
                   (unsigned long long)s[i].turn[0], s[i].n);
            fed += (uint64_t)bu_len[i] + (uint64_t)bu_new[i] - 1; // the last token is not fed back
        }
        fed -= b.met.prefix.reused_tokens;
        // B's prompt is in before C's, and E (younger, waiting for a slot) comes after both
        assert_true(s[1].turn[0] < s[2].turn[0] && s[2].turn[0] < s[4].turn[0]);
        assert_int_equal(st.forwards, st.turns);
        assert_int_equal(st.tokens, fed);
        assert_true(st.cut > 0 && st.deferred > 0);
        if (budget >= max_seqs) {
            assert_true(st.max_tokens <= (uint64_t)budget);
        } else { // the oldest prompt's token beyond the decode tokens
            assert_true(st.max_tokens > (uint64_t)budget && st.max_tokens <= (uint64_t)max_seqs);
        }
        // on /metrics as they are
        assert_int_equal(b.met.engine.turns, st.turns);
        assert_int_equal(b.met.engine.tokens, st.tokens);
        assert_int_equal(b.met.engine.max_tokens, st.max_tokens);
        assert_int_equal(b.met.max_batched_tokens, budget);
        if (!prefix) assert_int_equal(b.met.pages_free, 16); // (the prefix cache's entries keep theirs)
        bench_close(&b);
    }
}

// Six requests that sample (temperature 0.9; top-p 0.8 for every other one;
// each its own seed) run together on 4 threads, so that their rows are drawn
// side by side in the turns they share: each answer is token for token the
// one the request gets alone, where its draws come one a turn. A draw from
// another row's logits, or an order of draws that depends on the threads,
// changes tokens.
enum { SA_N = 6 };
static void test_sampled_rows(void **state) {
    int32_t prompt[SA_N][40];
    const int len[SA_N] = {3, 40, 7, 1, 22, 12}, n_new = 30;
    stream_t s[SA_N], alone;
    bench_t b;
    bench_open_cfg(&b, 12, SA_N, 0, 0, 4);
    for (int i = 0; i < SA_N; i++)
        for (int t = 0; t < len[i]; t++)
            prompt[i][t] = (t * (5 + 2 * i) + i + 2) % b.m.a.V;
    sampler_cfg_t smp[SA_N];
    for (int i = 0; i < SA_N; i++)
        smp[i] = (sampler_cfg_t){.temperature = 0.9f, .top_p = i % 2 ? 0.8f : 1.0f, .seed = 1000u + (uint64_t)i};
    for (int i = 0; i < SA_N; i++)
        submit_sampled(&b, &s[i], prompt[i], len[i], n_new, smp[i], on_token);
    srv_engine_run(b.e);
    srv_engine_stats_t st = srv_engine_stats(b.e);
    printf("  together: %llu forwards for %d tokens\n", (unsigned long long)st.forwards, SA_N * n_new);
    assert_true(st.forwards < (uint64_t)n_new + 8); // the rows shared their turns
    for (int i = 0; i < SA_N; i++) {
        assert_true(s[i].has_done);
        assert_int_equal(s[i].n, n_new);
        bench_t one;
        bench_open_cfg(&one, 12, SA_N, 0, 0, 4);
        submit_sampled(&one, &alone, prompt[i], len[i], n_new, smp[i], on_token);
        srv_engine_run(one.e);
        assert_true(alone.has_done);
        assert_int_equal(alone.n, n_new);
        assert_memory_equal(s[i].tok, alone.tok, sizeof(int32_t) * n_new);
        bench_close(&one);
    }
    bench_close(&b);
}

// Log-probabilities (srv_submit_t logprobs, top_logprobs): three requests
// in one batch, greedy with 3 alternatives, sampled with 0, and one that asks
// for none. Each token's log-probability is log_softmax of one forward's
// logits over the whole sequence at that token, within 2e-3 (the engine's
// prefill and decode steps round apart from that forward); the alternatives
// are that forward's most probable tokens, most probable first (a greedy
// token is the first of them); the third request's tokens come without.
static void test_logprobs(void **state) {
    enum { N = 3, NEW = 12 };
    int32_t prompt[N][20];
    const int len[N] = {5, 20, 9};
    stream_t s[N];
    sampler_logprob_t lps[N][NEW];
    bench_t b;
    bench_open_cfg(&b, 12, N, 0, 0, 0);
    for (int i = 0; i < N; i++)
        for (int t = 0; t < len[i]; t++)
            prompt[i][t] = (t * (3 + 2 * i) + i + 1) % b.m.a.V;
    for (int i = 0; i < N; i++) {
        sampler_cfg_t smp = {.temperature = i == 1 ? 0.8f : 0.0f, .top_p = 1, .seed = 7};
        memset(&s[i], 0, sizeof s[i]);
        s[i].b = &b;
        s[i].lp = i < 2 ? lps[i] : NULL;
        srv_submit_t q = {.prompt = prompt[i],
                          .n_prompt = len[i],
                          .max_new = NEW,
                          .sampler = smp,
                          .logprobs = i < 2,
                          .top_logprobs = i == 0 ? 3 : 0,
                          .on_token = on_token,
                          .on_done = on_done,
                          .user = &s[i]};
        uint64_t id;
        assert_int_equal(srv_engine_submit(b.e, &q, &id), 0);
        b.left++;
    }
    srv_submit_t bad = {.prompt = prompt[0], .n_prompt = 1, .max_new = 1, .logprobs = 1, .top_logprobs = 21};
    uint64_t bad_id;
    assert_true(srv_engine_submit(b.e, &bad, &bad_id) < 0);
    srv_engine_run(b.e);
    const int V = b.m.a.V;
    model_run_t r;
    assert_int_equal(model_run_create(&r, &b.m, 64u << 20), 0);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        assert_true(s[i].has_done);
        assert_int_equal(s[i].n, NEW);
        assert_int_equal(s[i].lp_null, i < 2 ? 0 : NEW);
        if (i == 2) continue;
        int T = len[i] + NEW;
        int32_t ids[20 + NEW];
        memcpy(ids, prompt[i], sizeof(int32_t) * len[i]);
        memcpy(ids + len[i], s[i].tok, sizeof(int32_t) * NEW);
        float *lg = malloc(sizeof(float) * (size_t)T * V);
        assert_int_equal(model_logits_all(&r, ids, 1, T, lg), 0);
        for (int j = 0; j < NEW; j++) {
            const float *l = lg + (size_t)(len[i] + j - 1) * V;
            sampler_logprob_t want;
            sampler_logprobs(l, V, s[i].tok[j], 3, &want);
            const sampler_logprob_t *p = &lps[i][j];
            double d = fabs(p->logprob - want.logprob);
            if (d > worst) worst = d;
            assert_true(p->logprob <= 0);
            assert_int_equal(p->n_top, i == 0 ? 3 : 0);
            for (int k = 0; k < p->n_top; k++) {
                assert_true(fabs(p->top_lp[k] - want.top_lp[k]) < 2e-3);
                if (k) assert_true(p->top_lp[k] <= p->top_lp[k - 1]);
            }
            if (i == 0) assert_int_equal(p->top_id[0], s[i].tok[j]); // greedy
        }
        free(lg);
    }
    printf("  worst log-probability against one forward: %.2e\n", worst);
    assert_true(worst < 2e-3);
    model_run_free(&r);
    bench_close(&b);
}

// Presence and frequency penalties (sampler_sample_after over the answer so
// far): a greedy request with both, in a batch beside one without. Each
// token is the argmax of one forward's logits at its position after the
// penalties of the tokens generated before it, within 1e-3 (the engine's
// steps round apart from that forward); the penalised answer repeats no
// token where the same prompt without penalties does (so the penalties
// took effect).
static void test_penalties(void **state) {
    enum { NEW = 24 };
    int32_t prompt[6] = {3, 4, 3, 4, 3, 4};
    stream_t s[2];
    bench_t b;
    bench_open_cfg(&b, 8, 2, 0, 0, 0);
    for (int i = 0; i < 2; i++) {
        sampler_cfg_t smp = {
            .temperature = 0, .top_p = 1, .presence_penalty = i ? 2.0f : 0, .frequency_penalty = i ? 0.5f : 0};
        submit_sampled(&b, &s[i], prompt, 6, NEW, smp, on_token);
    }
    srv_engine_run(b.e);
    const int V = b.m.a.V;
    int32_t ids[6 + NEW];
    memcpy(ids, prompt, sizeof prompt);
    memcpy(ids + 6, s[1].tok, sizeof(int32_t) * NEW);
    float *lg = malloc(sizeof(float) * (size_t)(6 + NEW) * V), *pen = malloc(sizeof(float) * V);
    model_run_t r;
    assert_int_equal(model_run_create(&r, &b.m, 64u << 20), 0);
    assert_int_equal(model_logits_all(&r, ids, 1, 6 + NEW, lg), 0);
    double worst = 0;
    for (int j = 0; j < NEW; j++) {
        memcpy(pen, lg + (size_t)(5 + j) * V, sizeof(float) * V);
        for (int t = 0; t < V; t++) {
            int c = 0;
            for (int k = 0; k < j; k++)
                c += s[1].tok[k] == t;
            if (c) pen[t] -= 0.5f * (float)c + 2.0f;
        }
        double gap = pen[sampler_argmax(pen, V)] - pen[s[1].tok[j]];
        if (gap > worst) worst = gap;
    }
    int rep_plain = 0, rep_pen = 0;
    for (int j = 0; j < NEW; j++)
        for (int k = 0; k < j; k++)
            rep_plain += s[0].tok[j] == s[0].tok[k], rep_pen += s[1].tok[j] == s[1].tok[k];
    printf("  worst gap to the penalised greedy token %.2e; repeats without penalties %d, with %d\n", worst, rep_plain,
           rep_pen);
    assert_true(worst < 1e-3);
    assert_true(rep_plain > 0);
    assert_int_equal(rep_pen, 0);
    model_run_free(&r);
    free(lg), free(pen);
    bench_close(&b);
}

// Greedy requests without penalties, biases or log-probabilities take their
// decode steps' tokens from the argmax on the device (model_greedy_queue, no
// logits copied): three together run such steps, and each answer is token
// for token the one the same request gets alone when it asks for
// log-probabilities, whose steps copy the logits and take the host's argmax
// (the same rule: the first index of the largest logit). A batch with that
// request in it runs no greedy step.
static void test_device_greedy(void **state) {
    enum { N = 3, NEW = 20 };
    int32_t prompt[N][24];
    const int len[N] = {5, 24, 11};
    stream_t s[N], alone;
    bench_t b;
    bench_open(&b, 12, N, 0);
    for (int i = 0; i < N; i++)
        for (int t = 0; t < len[i]; t++)
            prompt[i][t] = (t * (7 + 2 * i) + 3 * i + 1) % b.m.a.V;
    for (int i = 0; i < N; i++)
        submit(&b, &s[i], prompt[i], len[i], NEW);
    srv_engine_run(b.e);
    srv_engine_stats_t st = srv_engine_stats(b.e);
    printf("  together: %llu forwards, %llu of them greedy steps on the device\n", (unsigned long long)st.forwards,
           (unsigned long long)st.greedy);
    assert_true(st.greedy >= NEW - 2); // every step after the last prompt's prefill
    assert_true(st.greedy < st.forwards);
    for (int i = 0; i < N; i++) {
        assert_true(s[i].has_done);
        assert_int_equal(s[i].n, NEW);
        bench_t one;
        bench_open(&one, 12, N, 0);
        memset(&alone, 0, sizeof alone);
        alone.b = &one;
        srv_submit_t q = {.prompt = prompt[i],
                          .n_prompt = len[i],
                          .max_new = NEW,
                          .sampler = {.temperature = 0, .top_p = 1},
                          .logprobs = 1,
                          .on_token = on_token,
                          .on_done = on_done,
                          .user = &alone};
        uint64_t id;
        assert_int_equal(srv_engine_submit(one.e, &q, &id), 0);
        one.left++;
        srv_engine_run(one.e);
        assert_int_equal(srv_engine_stats(one.e).greedy, 0);
        assert_true(alone.has_done);
        assert_int_equal(alone.n, NEW);
        assert_memory_equal(s[i].tok, alone.tok, sizeof(int32_t) * NEW);
        bench_close(&one);
    }
    bench_close(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_prefix_pages),
        cmocka_unit_test(test_decode_rides_in_prefill),
        cmocka_unit_test(test_token_budget),
        cmocka_unit_test(test_sampled_rows),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_device_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
