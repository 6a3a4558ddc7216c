#include "model/params.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"

static int add(ptable_t *t, int layer, int no_decay, int nd, const int64_t *shape, const char *fmt, ...) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        param_t *p = realloc(t->p, (size_t)cap * sizeof *p);
        if (!p) return err_set(ERR_NOMEM, "out of memory for a parameter table of %d entries", cap);
        t->p = p;
        t->cap = cap;
    }
    param_t *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->nd = nd;
    p->numel = 1;
    // Shapes come from an arch_validate'd architecture, so each dimension is
    // at most LIM_WIDTH; the products and the running total are still formed
    // with overflow checks and held to their limits.
    for (int i = 0; i < nd; i++) {
        p->shape[i] = shape[i];
        if (shape[i] < 0 || __builtin_mul_overflow(p->numel, shape[i], &p->numel) || p->numel > LIM_NUMEL)
            return err_set(ERR_INPUT, "parameter %s: shape exceeds the limit of %lld elements", p->name,
                           (long long)LIM_NUMEL);
    }
    p->layer = layer;
    p->no_decay = no_decay;
    p->off = (t->total + 63) & ~(int64_t)63;
    t->total = p->off + p->numel;
    if (t->total > LIM_PARAMS)
        return err_set(ERR_INPUT, "parameter %s: the model exceeds the limit of %lld parameters", p->name,
                       (long long)LIM_PARAMS);
    return 0;
}

#define P1(l, nodecay, a0, ...) TRY(add(t, l, nodecay, 1, (int64_t[]){a0}, __VA_ARGS__))
#define P2(l, a0, a1, ...) TRY(add(t, l, 0, 2, (int64_t[]){a0, a1}, __VA_ARGS__))
#define P3(l, a0, a1, a2, ...) TRY(add(t, l, 0, 3, (int64_t[]){a0, a1, a2}, __VA_ARGS__))

static int layer_params(ptable_t *t, const arch_t *a, int l) {
    const char *pre = "model.layers";
    int d = a->d;
    P1(l, 1, d, "%s.%d.input_layernorm.weight", pre, l);
    switch (a->kind[l]) {
    case LAYER_ATTN:
        P2(l, (int64_t)a->H * a->dh, d, "%s.%d.self_attn.q_proj.weight", pre, l);
        P2(l, (int64_t)a->Hkv * a->dh, d, "%s.%d.self_attn.k_proj.weight", pre, l);
        P2(l, (int64_t)a->Hkv * a->dh, d, "%s.%d.self_attn.v_proj.weight", pre, l);
        P2(l, d, (int64_t)a->H * a->dh, "%s.%d.self_attn.o_proj.weight", pre, l);
        if (a->qk_norm) {
            P1(l, 1, a->dh, "%s.%d.self_attn.q_norm.weight", pre, l);
            P1(l, 1, a->dh, "%s.%d.self_attn.k_norm.weight", pre, l);
        }
        break;
    case LAYER_MLA: {
        const mla_dims_t *m = &a->mla;
        int rq = arch_mla_rq(a, l), rkv = arch_mla_rkv(a, l), qd = m->d_nope + m->d_rope;
        // q_a then kv_a, one after the other: a decode step multiplies by both
        // at once (mla.c project)
        if (rq > 0) {
            P2(l, rq, d, "%s.%d.mla.q_a_proj.weight", pre, l);
            P2(l, rkv + m->d_rope, d, "%s.%d.mla.kv_a_proj_with_mqa.weight", pre, l);
            if (m->latent_norm) P1(l, 1, rq, "%s.%d.mla.q_a_layernorm.weight", pre, l);
            P2(l, (int64_t)a->H * qd, rq, "%s.%d.mla.q_b_proj.weight", pre, l);
        } else {
            P2(l, (int64_t)a->H * qd, d, "%s.%d.mla.q_proj.weight", pre, l);
            P2(l, rkv + m->d_rope, d, "%s.%d.mla.kv_a_proj_with_mqa.weight", pre, l);
        }
        if (m->latent_norm) P1(l, 1, rkv, "%s.%d.mla.kv_a_layernorm.weight", pre, l);
        P2(l, (int64_t)m->n_kv * (m->d_nope + m->d_v), rkv, "%s.%d.mla.kv_b_proj.weight", pre, l);
        P2(l, d, (int64_t)a->H * m->d_v, "%s.%d.mla.out_proj.weight", pre, l);
        if (a->qk_norm) { // Qwen3: q norm per head over qd, k norm on the shared rope key
            P1(l, 1, qd, "%s.%d.mla.q_norm.weight", pre, l);
            P1(l, 1, m->d_rope, "%s.%d.mla.k_norm.weight", pre, l);
        }
        break;
    }
    case LAYER_GDN: {
        const gdn_dims_t *g = &a->gdn;
        int64_t kd = (int64_t)g->n_heads * g->head_k, vd = (int64_t)g->n_v_heads * g->head_v;
        // q, k, v, a, b and g one after another: a decode step multiplies by
        // all six at once (gdn.c gdn_run)
        P2(l, kd, d, "%s.%d.gdn.q_proj.weight", pre, l);
        P2(l, kd, d, "%s.%d.gdn.k_proj.weight", pre, l);
        P2(l, vd, d, "%s.%d.gdn.v_proj.weight", pre, l);
        P2(l, g->n_v_heads, d, "%s.%d.gdn.a_proj.weight", pre, l);
        P2(l, g->n_v_heads, d, "%s.%d.gdn.b_proj.weight", pre, l);
        if (g->use_gate) P2(l, vd, d, "%s.%d.gdn.g_proj.weight", pre, l);
        P1(l, 1, g->n_v_heads, "%s.%d.gdn.A_log", pre, l);
        P1(l, 1, g->n_v_heads, "%s.%d.gdn.dt_bias", pre, l);
        P3(l, kd, 1, g->conv, "%s.%d.gdn.q_conv1d.weight", pre, l);
        P3(l, kd, 1, g->conv, "%s.%d.gdn.k_conv1d.weight", pre, l);
        P3(l, vd, 1, g->conv, "%s.%d.gdn.v_conv1d.weight", pre, l);
        P1(l, 1, g->head_v, "%s.%d.gdn.o_norm.weight", pre, l);
        P2(l, d, vd, "%s.%d.gdn.o_proj.weight", pre, l);
        break;
    }
    case LAYER_M2: {
        const m2_dims_t *m = &a->m2;
        int64_t conv_dim = (int64_t)m->d_inner + 2 * m->d_xb;
        P2(l, 2 * (int64_t)m->d_inner + 2 * m->d_xb + m->n_heads, d, "%s.%d.mamba.in_proj.weight", pre, l);
        P3(l, conv_dim, 1, m->conv, "%s.%d.mamba.conv1d.weight", pre, l);
        P1(l, 0, conv_dim, "%s.%d.mamba.conv1d.bias", pre, l);
        P1(l, 1, m->n_heads, "%s.%d.mamba.dt_bias", pre, l);
        P1(l, 1, m->n_heads, "%s.%d.mamba.A_log", pre, l);
        P1(l, 1, m->n_heads, "%s.%d.mamba.D", pre, l);
        P1(l, 1, m->d_inner, "%s.%d.mamba.norm.weight", pre, l);
        P2(l, d, m->d_inner, "%s.%d.mamba.out_proj.weight", pre, l);
        break;
    }
    }
    P1(l, 1, d, "%s.%d.post_attention_layernorm.weight", pre, l);
    P2(l, a->ffn, d, "%s.%d.mlp.gate_proj.weight", pre, l);
    P2(l, a->ffn, d, "%s.%d.mlp.up_proj.weight", pre, l);
    P2(l, d, a->ffn, "%s.%d.mlp.down_proj.weight", pre, l);
    return 0;
}

int ptable_build(ptable_t *t, const arch_t *a) {
    memset(t, 0, sizeof *t);
    int rc = 0;
    do {
        if ((rc = add(t, -1, 0, 2, (int64_t[]){a->V, a->d}, "model.embed_tokens.weight")) < 0) break;
        for (int l = 0; l < a->n_layers && rc == 0; l++)
            rc = layer_params(t, a, l);
        if (rc < 0) break;
        if ((rc = add(t, -1, 1, 1, (int64_t[]){a->d}, "model.norm.weight")) < 0) break;
        if (!a->tie_embeddings) rc = add(t, -1, 0, 2, (int64_t[]){a->V, a->d}, "lm_head.weight");
    } while (0);
    if (rc < 0) ptable_free(t);
    return rc;
}

void ptable_free(ptable_t *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

const param_t *ptable_find(const ptable_t *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->p[i].name, name)) return &t->p[i];
    return NULL;
}

int64_t ptable_off(const ptable_t *t, const char *name) {
    const param_t *p = ptable_find(t, name);
    return p ? p->off : -1;
}

// The matrices read only through lin_fwd or the embedding lookup: the embedding and head, and
// every projection (attention, MLP, MLA, GDN, Mamba-2: the *_proj weights)
// except MLA's kv_b, which its absorbed decode multiplies directly.
int ptable_quantisable(const param_t *p) {
    if (!strcmp(p->name, "model.embed_tokens.weight") || !strcmp(p->name, "lm_head.weight")) return 1;
    if (p->layer < 0 || p->nd != 2) return 0;
    size_t n = strlen(p->name);
    int proj = (n > 12 && !strcmp(p->name + n - 12, "_proj.weight")) ||
               (n > 21 && !strcmp(p->name + n - 21, "_proj_with_mqa.weight"));
    return proj && !strstr(p->name, "kv_b_proj");
}

int64_t ptable_count(const ptable_t *t) {
    int64_t n = 0;
    for (int i = 0; i < t->n; i++)
        n += t->p[i].numel;
    return n;
}

int ptable_alloc_host(const ptable_t *t, const char *what, int zero, float **out) {
    size_t n = (size_t)(t->total ? t->total : 1);
    *out = zero ? calloc(n, sizeof(float)) : malloc(n * sizeof(float));
    if (!*out)
        return err_set(ERR_NOMEM, "cannot allocate %zu bytes for %s (%lld fp32 parameters)", n * sizeof(float), what,
                       (long long)ptable_count(t));
    return 0;
}
