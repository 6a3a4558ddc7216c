#include "testutil.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/rng.h"
#include "base/half.h"
#include "model/rope.h"

void tu_randn(float *x, int64_t n, uint64_t seed, float std) {
    rng_t r;
    rng_seed(&r, seed);
    rng_fill_normal(&r, x, n, 0.0f, std);
}

void tu_randu(float *x, int64_t n, uint64_t seed, float lo, float hi) {
    rng_t r;
    rng_seed(&r, seed);
    rng_fill_uniform(&r, x, n, lo, hi);
}

double tu_rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
    }
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}

double tu_max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

double tu_inc_rel_err(const float *a, const float *b, const float *a0, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        double da = (double)a[i] - a0[i], db = (double)b[i] - a0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    return sqrt(num / (den > 1e-300 ? den : 1e-300));
}

double tu_dot(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

double tu_dot_l1(const float *a, const float *b, int64_t n, double *l1) {
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        m += fabs((double)a[i] * b[i]);
    }
    if (l1) *l1 = m;
    return s;
}

static int judge(const char *what, const char *kind, int64_t idx, double fd, double an, float tol, double noise) {
    double scale = fmax(fabs(fd), fabs(an));
    if (fabs(fd - an) <= tol * scale + noise && !isnan(fd) && !isnan(an)) return 0;
    printf("  gradcheck %s: %s %lld: finite difference %.6e, analytic %.6e (|diff| %.3e > %.1e rel + %.2e noise)\n",
           what, kind, (long long)idx, fd, an, fabs(fd - an), tol, noise);
    return 1;
}

int tu_gradcheck(const char *what, tu_loss_fn f, void *ctx, float *x, const float *g, int64_t n, float eps, float tol,
                 int n_elems) {
    int fails = 0;
    double l1 = 0;
    f(ctx, &l1);
    double noise = 4.0 * 5.96e-8 * l1 / eps;
    float *x0 = malloc((size_t)n * sizeof(float)), *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x0[i] = x[i];
    rng_t r;
    rng_seed(&r, 1234 + (uint64_t)n);
    for (int dir = 0; dir < 3; dir++) {
        rng_fill_normal(&r, v, n, 0, 1);
        double vn = sqrt(tu_dot(v, v, n));
        for (int64_t i = 0; i < n; i++)
            v[i] = (float)(v[i] / vn);
        for (int64_t i = 0; i < n; i++)
            x[i] = x0[i] + eps * v[i];
        double fp = f(ctx, NULL);
        for (int64_t i = 0; i < n; i++)
            x[i] = x0[i] - eps * v[i];
        double fm = f(ctx, NULL);
        for (int64_t i = 0; i < n; i++)
            x[i] = x0[i];
        fails += judge(what, "direction", dir, (fp - fm) / (2.0 * eps), tu_dot(g, v, n), tol, noise);
    }
    int64_t m = n <= n_elems ? n : n_elems;
    for (int64_t k = 0; k < m; k++) {
        int64_t i = n <= n_elems ? k : (int64_t)(rng_u64(&r) % (uint64_t)n);
        x[i] = x0[i] + eps;
        double fp = f(ctx, NULL);
        x[i] = x0[i] - eps;
        double fm = f(ctx, NULL);
        x[i] = x0[i];
        fails += judge(what, "element", i, (fp - fm) / (2.0 * eps), g[i], tol, noise);
    }
    free(x0);
    free(v);
    return fails;
}

be_t *tu_cpu(void) {
    static be_t *be;
    if (!be && be_create(&be, "cpu", 256u << 20) < 0) {
        printf("cannot create the CPU backend: %s\n", err_msg());
        abort();
    }
    return be;
}

const char *tu_model_path(void) {
    const char *p = getenv("HYLO_MODEL");
    if (!p || !*p) {
        printf("HYLO_MODEL is not set (run through make test)\n");
        skip();
    }
    return p;
}

static char tu_tmp[256]; // empty while there is no folder

int tu_tmpdir_setup(void **state) {
    (void)state;
    snprintf(tu_tmp, sizeof tu_tmp, "/tmp/hylo_%s_XXXXXX", program_invocation_short_name);
    if (mkdtemp(tu_tmp)) return 0;
    tu_tmp[0] = 0;
    return -1;
}

static int tu_rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int tu_tmpdir_teardown(void **state) {
    (void)state;
    if (!tu_tmp[0]) return 0;
    int rc = nftw(tu_tmp, tu_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    tu_tmp[0] = 0;
    return rc;
}

const char *tu_tmpdir(void) {
    if (!tu_tmp[0]) assert_int_equal(tu_tmpdir_setup(NULL), 0);
    return tu_tmp;
}

const char *tu_tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tu_tmpdir(), name);
    return p;
}

void tu_corpus_save(const char *path) {
    const char *dir = getenv("HYLO_CORPUS_OUT");
    if (!dir || !*dir) return;
    char *data;
    size_t n;
    if (fs_read_all(path, &data, &n) < 0) return;
    const char *base = strrchr(path, '/');
    char out[1024];
    snprintf(out, sizeof out, "%s/%s", dir, base ? base + 1 : path);
    if (n <= 65536) fs_write_all(out, data, n);
    free(data);
}

int tu_run_hylo(const char *args, char **err) {
    const char *bin = getenv("HYLO_BIN");
    if (!bin) {
        printf("HYLO_BIN is not set (run through make test)\n");
        skip();
    }
    char cmd[4096], path[300];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), err ? "stderr.txt" : "out.txt");
    if (err)
        snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", bin, args, path);
    else
        snprintf(cmd, sizeof cmd, "%s %s > %s 2>&1", bin, args, path);
    int rc = system(cmd);
    if (err) {
        assert_true(WIFEXITED(rc)); // never killed by a signal
        size_t n;
        assert_int_equal(fs_read_all(path, err, &n), 0);
        printf("  hylo %s\n    -> exit %d: %s", args, WEXITSTATUS(rc), *err);
    } else {
        char *out;
        if (fs_read_all(path, &out, NULL) == 0) {
            printf("  hylo %s -> %d\n%s", args, WEXITSTATUS(rc), out);
            free(out);
        }
    }
    return WEXITSTATUS(rc);
}

float *tu_params(const ptable_t *t, uint64_t seed, float std) {
    float *w = calloc((size_t)t->total, sizeof(float));
    rng_t r;
    rng_seed(&r, seed);
    for (int i = 0; i < t->n; i++) {
        const param_t *p = &t->p[i];
        if (p->nd == 1 && p->no_decay)
            rng_fill_normal(&r, w + p->off, p->numel, 1.0f, 0.1f);
        else
            rng_fill_normal(&r, w + p->off, p->numel, 0.0f, std);
    }
    return w;
}

void tu_ctx(layer_ctx_t *c, const arch_t *a, int layer) {
    memset(c, 0, sizeof *c);
    c->be = tu_cpu();
    c->a = a;
    c->layer = layer;
    c->arena = malloc(sizeof(arena_t));
    size_t cap = (size_t)512 << 20;
    arena_init(c->arena, malloc(cap), cap, "test arena");
    const rope_cfg_t *rc = a->kind[layer] == LAYER_MLA ? &a->mla.rope : &a->rope;
    int dr = a->kind[layer] == LAYER_MLA ? a->mla.d_rope : a->dh;
    if (dr > 0) {
        c->rope_npos = 4096;
        float *cs = malloc((size_t)c->rope_npos * (dr / 2) * sizeof(float));
        float *sn = malloc((size_t)c->rope_npos * (dr / 2) * sizeof(float));
        rope_tables(rc, dr, c->rope_npos, cs, sn);
        c->rope_cos = cs;
        c->rope_sin = sn;
    }
}

void tu_ctx_reset(layer_ctx_t *c) { arena_reset(c->arena, 0); }

void tu_ctx_free(layer_ctx_t *c) {
    free(c->arena->base);
    free(c->arena);
    free((void *)c->rope_cos);
    free((void *)c->rope_sin);
    memset(c, 0, sizeof *c);
}

be_t *tu_cuda(void) {
    static be_t *be;
    static int tried;
    if (!tried) {
        tried = 1;
        if (be_create(&be, "cuda", 256u << 20) < 0) {
            printf("no CUDA backend: %s\n", err_msg());
            be = NULL;
        }
    }
    if (!be) {
        const char *req = getenv("HYLO_REQUIRE_GPU");
        if (req && *req == '1') fail_msg("HYLO_REQUIRE_GPU=1 and there is no CUDA backend");
        skip();
    }
    return be;
}

void tu_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

void *tu_dev_act(be_t *be, const float *h, int64_t n) {
    void *d = be->alloc(be, (size_t)(n ? n : 1) * be->act_size);
    assert_non_null(d);
    assert_int_equal(be->upload_act(be, d, h, n), 0);
    return d;
}

float *tu_dev_f32(be_t *be, const float *h, int64_t n) {
    float *d = be->alloc(be, (size_t)(n ? n : 1) * sizeof(float));
    assert_non_null(d);
    assert_int_equal(be->copy_h2d(be, d, h, (size_t)n * sizeof(float)), 0);
    return d;
}

float *tu_host_act(be_t *be, const void *d, int64_t n) {
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(be->sync(be), 0);
    assert_int_equal(be->download_act(be, h, d, n), 0);
    return h;
}

float *tu_host_f32(be_t *be, const float *d, int64_t n) {
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(be->sync(be), 0);
    assert_int_equal(be->copy_d2h(be, h, d, (size_t)n * sizeof(float)), 0);
    return h;
}

void tu_rows_gather(float *dst, const float *x, int B, int T, int t0, int n, int d) {
    for (int b = 0; b < B; b++)
        memcpy(dst + (int64_t)b * n * d, x + ((int64_t)b * T + t0) * d, (size_t)n * d * sizeof(float));
}

void tu_rows_scatter(float *x, const float *src, int B, int T, int t0, int n, int d) {
    for (int b = 0; b < B; b++)
        memcpy(x + ((int64_t)b * T + t0) * d, src + (int64_t)b * n * d, (size_t)n * d * sizeof(float));
}

int tu_fake_gpu(void) {
    const char *e = getenv("HYLO_TEST_CPU_AS_GPU");
    return e && *e == '1';
}

be_t *tu_gpu(void) {
    static be_t *fake;
    if (!tu_fake_gpu()) return tu_cuda();
    if (!fake && be_create(&fake, "cpu", 256u << 20) < 0) {
        printf("cannot create the fake GPU (a CPU backend): %s\n", err_msg());
        abort();
    }
    return fake;
}

float *tu_hbuf(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(p);
    return p;
}

float *tu_hdup(const float *h, int64_t n) {
    float *p = tu_hbuf(n);
    if (n > 0) memcpy(p, h, (size_t)n * sizeof(float));
    return p;
}

float *tu_nans(int64_t n) {
    float *p = tu_hbuf(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

float *tu_rnd(int64_t n, uint64_t seed, float std) {
    float *p = tu_hbuf(n);
    tu_randn(p, n, seed, std);
    tu_round_bf16(p, n);
    return p;
}

void *tu_gat(be_t *be, void *d, int64_t off) { return (char *)d + (size_t)off * be->act_size; }

int32_t *tu_dev_i32(be_t *be, const int32_t *h, int64_t n) {
    int32_t *d = be->alloc(be, (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    assert_non_null(d);
    assert_int_equal(be->copy_h2d(be, d, h, (size_t)n * sizeof(int32_t)), 0);
    return d;
}

void tu_dev_free(be_t *be, void *d) {
    if (d) be->free(be, d);
}

void tu_upload_act(be_t *be, void *d, const float *h, int64_t n) { assert_int_equal(be->upload_act(be, d, h, n), 0); }

void tu_upload_f32(be_t *be, float *d, const float *h, int64_t n) {
    assert_int_equal(be->copy_h2d(be, d, h, (size_t)n * sizeof(float)), 0);
}

int tu_sync(be_t *be, const char *op, const char *shape) {
    int rc = be->sync(be);
    if (rc != 0) printf("FAIL %s %s: cuda error: %s\n", op, shape, err_msg());
    fflush(stdout);
    return rc == 0;
}

tu_cmp_t tu_compare(const float *got, const float *ref, int64_t n, double rtol, double rms_tol, double abs_tol) {
    tu_cmp_t c = {.first = -1};
    for (int64_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        c.ss += (double)ref[i] * ref[i];
        c.se += e * e;
        if (!isfinite(got[i])) c.nonfinite = 1;
    }
    c.rms = n > 0 ? sqrt(c.ss / (double)n) : 0.0;
    double worst = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i]) || isnan(d)) d = INFINITY;
        if (d > worst) worst = d, c.worst = i;
        if (!(d <= rtol * fabs((double)ref[i]) + rms_tol * c.rms + abs_tol)) {
            if (c.first < 0) c.first = i;
            c.n_off++;
        }
    }
    c.max_abs = n > 0 ? worst : 0.0;
    c.rel = c.nonfinite ? INFINITY : n > 0 ? tu_rel_err(got, ref, n) : 0.0;
    return c;
}

void tu_print_elem(const char *prefix, const float *got, const float *ref, int64_t i, const int64_t dims[4],
                   const char *axes, double rms) {
    int64_t c[4], r = i;
    for (int k = 3; k >= 0; k--)
        c[k] = r % dims[k], r /= dims[k];
    printf("%s [%c=%lld %c=%lld %c=%lld %c=%lld]: gpu %.6g cpu %.6g (rms %.3g)\n", prefix, axes[0], (long long)c[0],
           axes[1], (long long)c[1], axes[2], (long long)c[2], axes[3], (long long)c[3], got[i], ref[i], rms);
}

arch_t tu_tiny_arch(const layer_kind_t *plan, int n, int yarn, int tied) {
    arch_t a;
    arch_init(&a);
    a.d = 32, a.n_layers = n, a.H = 4, a.Hkv = 2, a.dh = 8, a.ffn = 48, a.V = 61, a.tie_embeddings = tied;
    a.rope.theta = 1000.0f;
    for (int l = 0; l < n; l++)
        a.kind[l] = plan[l];
    a.mla = (mla_dims_t){.r_q = 16, .r_kv = 12, .d_nope = 4, .d_rope = 4, .d_v = 8, .n_kv = 2};
    a.mla.rope = a.rope;
    if (yarn) {
        a.mla.rope.scaling = ROPE_SCALE_YARN, a.mla.rope.factor = 4, a.mla.rope.orig_max_pos = 16;
        a.mla.rope.beta_fast = 32, a.mla.rope.beta_slow = 1, a.mla.rope.mscale = 1;
    }
    a.m2 = (m2_dims_t){
        .d_inner = 32, .d_xb = 16, .n_heads = 4, .headdim = 8, .d_state = 8, .conv = 4, .chunk = 8, .norm_eps = 1e-5f};
    a.gdn = (gdn_dims_t){
        .n_heads = 2, .n_v_heads = 2, .head_k = 8, .head_v = 16, .conv = 4, .use_gate = 1, .norm_eps = 1e-6f};
    a.is_hybrid = 1;
    return a;
}

int tu_list_has(const char *list, long k) {
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return 0;
        if (v == k) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}
