// Independent numerics: each layer against a PyTorch transcription of the spec
// (scripts/ref/layers_ref.py, float64, autograd), run on the GPU machine with
// seeded random weights and committed as tests/fixtures/model/layer_*.safetensors.
// Forward output and the gradients of the input and of every parameter must
// match. Our CPU reference computes in fp32, the fixture in float64 rounded to
// fp32: rel err ~1e-6 expected; bound 1e-4 (a wrong term gives O(1e-2..1)).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/gdn.h"
#include "model/m2.h"
#include "model/mla.h"
#include "testutil.h"

#define TOL 1e-4

static const char *fixture(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "tests/fixtures/model/%s", name);
    FILE *f = fopen(buf, "rb");
    if (!f) {
        fail_msg("%s is missing (committed; regenerate with scripts/ref/layers_ref.py on the GPU machine)", buf);
    }
    fclose(f);
    return buf;
}

static int meta_int(const st_file_t *f, const char *key) {
    const char *v = st_meta(f, key);
    assert_non_null(v);
    return atoi(v);
}

static float *tensor(const st_file_t *f, const char *name, int64_t *n) {
    const st_tensor_t *t = st_find(f, name);
    if (!t) printf("  fixture tensor %s is missing\n", name);
    assert_non_null(t);
    float *p = malloc((size_t)t->numel * sizeof(float));
    assert_int_equal(st_read_f32(f, t, p), 0);
    if (n) *n = t->numel;
    return p;
}

// Copies every fixture parameter of the layer into the flat weight buffer.
static void load_params(const st_file_t *f, const ptable_t *pt, float *w, const char *prefix) {
    int found = 0;
    for (int i = 0; i < pt->n; i++) {
        const param_t *p = &pt->p[i];
        if (strncmp(p->name, prefix, strlen(prefix))) continue;
        const st_tensor_t *t = st_find(f, p->name);
        if (!t) printf("  fixture lacks %s\n", p->name);
        assert_non_null(t);
        assert_int_equal(t->numel, p->numel);
        assert_int_equal(st_read_f32(f, t, w + p->off), 0);
        found++;
    }
    assert_true(found > 0);
}

static void check(const char *what, const float *got, const float *want, int64_t n, double *worst) {
    double e = tu_rel_err(got, want, n);
    printf("  %-48s rel err %.2e\n", what, e);
    if (e > *worst) *worst = e;
}

// Compares the gradients of every parameter under `prefix`.
static void check_grads(const st_file_t *f, const ptable_t *pt, const float *g, const char *prefix, double *worst) {
    for (int i = 0; i < pt->n; i++) {
        const param_t *p = &pt->p[i];
        if (strncmp(p->name, prefix, strlen(prefix))) continue;
        char gname[160];
        snprintf(gname, sizeof gname, "grad.%s", p->name);
        float *want = tensor(f, gname, NULL);
        check(gname, g + p->off, want, p->numel, worst);
        free(want);
    }
}

typedef struct {
    st_file_t f;
    arch_t a;
    ptable_t pt;
    float *w, *g, *x, *dout, *out, *dx;
    int T;
    layer_ctx_t c;
} fx_t;

static void fx_open(fx_t *s, const char *file) {
    char buf[256];
    memset(s, 0, sizeof *s);
    assert_int_equal(st_open(&s->f, fixture(file, buf, sizeof buf)), 0);
    s->T = meta_int(&s->f, "T");
    arch_init(&s->a);
    s->a.d = meta_int(&s->f, "d");
    s->a.n_layers = 1, s->a.ffn = 8, s->a.V = 8;
}

static void fx_build(fx_t *s) {
    assert_int_equal(arch_validate(&s->a, "fixture arch"), 0);
    assert_int_equal(ptable_build(&s->pt, &s->a), 0);
    s->w = calloc((size_t)s->pt.total, sizeof(float));
    s->g = calloc((size_t)s->pt.total, sizeof(float));
    s->x = tensor(&s->f, "x", NULL);
    s->dout = tensor(&s->f, "dout", NULL);
    s->out = malloc((size_t)s->T * s->a.d * sizeof(float));
    s->dx = malloc((size_t)s->T * s->a.d * sizeof(float));
    tu_ctx(&s->c, &s->a, 0);
}

static void fx_check_out(fx_t *s, double *worst) {
    float *want = tensor(&s->f, "out", NULL), *dxw = tensor(&s->f, "grad.x", NULL);
    check("out", s->out, want, (int64_t)s->T * s->a.d, worst);
    check("grad.x", s->dx, dxw, (int64_t)s->T * s->a.d, worst);
    free(want);
    free(dxw);
}

static void fx_close(fx_t *s) {
    tu_ctx_free(&s->c);
    free(s->w), free(s->g), free(s->x), free(s->dout), free(s->out), free(s->dx);
    ptable_free(&s->pt);
    st_close(&s->f);
}

static void test_mla_fixture(void **st) {
    fx_t s;
    fx_open(&s, "layer_mla.safetensors");
    arch_t *a = &s.a;
    a->H = meta_int(&s.f, "H"), a->Hkv = meta_int(&s.f, "Hkv"), a->dh = 12;
    a->kind[0] = LAYER_MLA;
    a->mla = (mla_dims_t){.r_q = meta_int(&s.f, "r_q"), .r_kv = meta_int(&s.f, "r_kv"),
                          .d_nope = meta_int(&s.f, "d_nope"), .d_rope = meta_int(&s.f, "d_rope"),
                          .d_v = meta_int(&s.f, "d_v"), .n_kv = meta_int(&s.f, "n_kv")};
    a->mla.rope = a->rope;
    a->mla.rope.theta = (float)atof(st_meta(&s.f, "rope_theta"));
    a->mla.rope.scaling = ROPE_SCALE_YARN;
    a->mla.rope.factor = (float)atof(st_meta(&s.f, "yarn_factor"));
    a->mla.rope.orig_max_pos = meta_int(&s.f, "yarn_orig");
    fx_build(&s);
    load_params(&s.f, &s.pt, s.w, "model.layers.0.mla.");
    mla_w_t w, g;
    assert_int_equal(mla_w_bind(&w, &s.pt, s.w, sizeof(float), 0), 0);
    assert_int_equal(mla_w_bind(&g, &s.pt, s.g, sizeof(float), 0), 0);
    mla_saved_t sv;
    assert_int_equal(mla_forward(&s.c, &w, s.out, s.x, 1, s.T, 0, NULL, &sv), 0);
    assert_int_equal(mla_backward(&s.c, &w, &g, s.dx, s.dout, &sv), 0);
    double worst = 0;
    fx_check_out(&s, &worst);
    check_grads(&s.f, &s.pt, s.g, "model.layers.0.mla.", &worst);
    assert_true(worst < TOL);
    fx_close(&s);
}

static void test_gdn_fixture(void **st) {
    fx_t s;
    fx_open(&s, "layer_gdn.safetensors");
    arch_t *a = &s.a;
    a->H = 1, a->Hkv = 1, a->dh = 8;
    a->kind[0] = LAYER_GDN;
    a->gdn = (gdn_dims_t){.n_heads = meta_int(&s.f, "gdn_heads"), .n_v_heads = meta_int(&s.f, "gdn_v_heads"),
                          .head_k = meta_int(&s.f, "head_k"), .head_v = meta_int(&s.f, "head_v"),
                          .conv = meta_int(&s.f, "conv"), .use_gate = 1,
                          .norm_eps = (float)atof(st_meta(&s.f, "norm_eps"))};
    fx_build(&s);
    load_params(&s.f, &s.pt, s.w, "model.layers.0.gdn.");
    gdn_w_t w, g;
    assert_int_equal(gdn_w_bind(&w, &s.pt, s.w, sizeof(float), 0), 0);
    assert_int_equal(gdn_w_bind(&g, &s.pt, s.g, sizeof(float), 0), 0);
    gdn_saved_t sv;
    assert_int_equal(gdn_forward(&s.c, &w, s.out, s.x, 1, s.T, 0, NULL, &sv), 0);
    assert_int_equal(gdn_backward(&s.c, &w, &g, s.dx, s.dout, &sv), 0);
    double worst = 0;
    fx_check_out(&s, &worst);
    check_grads(&s.f, &s.pt, s.g, "model.layers.0.gdn.", &worst);
    assert_true(worst < TOL);
    fx_close(&s);
}

static void test_m2_fixture(void **st) {
    fx_t s;
    fx_open(&s, "layer_m2.safetensors");
    arch_t *a = &s.a;
    a->H = meta_int(&s.f, "H"), a->Hkv = meta_int(&s.f, "Hkv"), a->dh = meta_int(&s.f, "dh");
    a->kind[0] = LAYER_M2;
    a->m2 = (m2_dims_t){.d_inner = meta_int(&s.f, "d_inner"), .d_xb = meta_int(&s.f, "d_xb"), .n_heads = a->H,
                        .headdim = a->dh, .d_state = a->dh, .conv = meta_int(&s.f, "conv"),
                        .chunk = 16, // T = 40 crosses two chunk boundaries
                        .norm_eps = (float)atof(st_meta(&s.f, "norm_eps"))};
    fx_build(&s);
    load_params(&s.f, &s.pt, s.w, "model.layers.0.mamba.");
    m2_w_t w, g;
    assert_int_equal(m2_w_bind(&w, &s.pt, s.w, sizeof(float), 0), 0);
    assert_int_equal(m2_w_bind(&g, &s.pt, s.g, sizeof(float), 0), 0);
    m2_saved_t sv;
    assert_int_equal(m2_forward(&s.c, &w, s.out, s.x, 1, s.T, 0, NULL, &sv), 0);
    assert_int_equal(m2_backward(&s.c, &w, &g, s.dx, s.dout, &sv), 0);
    double worst = 0;
    fx_check_out(&s, &worst);
    check_grads(&s.f, &s.pt, s.g, "model.layers.0.mamba.", &worst);
    assert_true(worst < TOL);
    fx_close(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mla_fixture),
        cmocka_unit_test(test_gdn_fixture),
        cmocka_unit_test(test_m2_fixture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
