#include "upcycle/upcycle.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "model/attn.h"
#include "model/gdn.h"
#include "model/m2.h"
#include "model/mla.h"

// ---- student architecture ----------------------------------------------------

int upc_plan(int n_layers, const int *mla_layers, int n_mla, layer_kind_t kind_linear, layer_kind_t *kind) {
    for (int l = 0; l < n_layers; l++)
        kind[l] = kind_linear;
    for (int i = 0; i < n_mla; i++) {
        int l = mla_layers[i];
        if (l < 0 || l >= n_layers)
            return err_set(ERR_INPUT, "MLA layer index %d is out of range (the teacher has %d layers)", l, n_layers);
        if (kind[l] == LAYER_MLA) return err_set(ERR_INPUT, "MLA layer index %d is listed twice", l);
        kind[l] = LAYER_MLA;
    }
    return 0;
}

int upc_student_arch(const arch_t *t, const int *mla_layers, int n_mla, layer_kind_t kind_linear,
                     const upc_dims_t *dims, arch_t *s) {
    if (kind_linear != LAYER_GDN && kind_linear != LAYER_M2)
        return err_set(ERR_INPUT, "the linear layer kind must be GDN or Mamba-2");
    // The teacher's sizes within their limits before the products below are formed in int.
    TRY(arch_validate(t, "teacher"));
    for (int l = 0; l < t->n_layers; l++)
        if (t->kind[l] != LAYER_ATTN)
            return err_set(ERR_INPUT, "the teacher must be a plain Transformer (layer %d is %s)", l,
                           layer_kind_name(t->kind[l]));
    *s = *t;
    s->is_hybrid = 1;
    TRY(upc_plan(t->n_layers, mla_layers, n_mla, kind_linear, s->kind));
    // MLA (hylo_recipe.md §1): d_nope = d_rope = dh/2, d_v = dh, r_kv = min(128,
    // KV width / 8), r_q = H*dh/2; these give the published Llama-3.2-3B and
    // Qwen3 settings; Llama-3.2-1B's published r_q (1344) is the one exception.
    mla_dims_t *m = &s->mla;
    memset(m, 0, sizeof *m);
    m->d_rope = dims->d_rope ? dims->d_rope : t->dh / 2;
    m->d_nope = dims->d_nope ? dims->d_nope : t->dh / 2;
    m->d_v = dims->d_v ? dims->d_v : t->dh;
    int kv_width = 2 * t->Hkv * t->dh;
    m->r_kv = dims->r_kv ? dims->r_kv : (kv_width / 8 < 128 ? (kv_width / 8) & ~7 : 128);
    if (m->r_kv < 8 && !dims->r_kv) m->r_kv = 8;
    int llama1b = t->d == 2048 && t->n_layers == 16 && t->H == 32 && t->Hkv == 8 && t->dh == 64;
    m->r_q = dims->r_q ? dims->r_q : llama1b ? 1344 : ((t->H * t->dh / 2) & ~7);
    m->n_kv = t->Hkv;
    m->rope = t->rope;
    m->rope.scaling = ROPE_SCALE_NONE;
    m->rope.n_freq_div = 0;
    if (dims->yarn_factor > 1.0f) {
        m->rope.scaling = ROPE_SCALE_YARN;
        m->rope.factor = dims->yarn_factor;
        m->rope.orig_max_pos = dims->yarn_orig > 0 ? dims->yarn_orig : 2048;
        m->rope.beta_fast = 32, m->rope.beta_slow = 1, m->rope.mscale = 1, m->rope.mscale_all_dim = 0;
        m->rope.attn_factor = 0;
    }
    if (m->d_nope + m->d_rope > t->dh || m->d_v > t->dh)
        return err_set(ERR_INPUT, "MLA head dims (nope %d + rope %d, v %d) must fit the teacher's head dim %d",
                       m->d_nope, m->d_rope, m->d_v, t->dh);
    memset(s->mla_rank_q, 0, sizeof s->mla_rank_q);
    memset(s->mla_rank_kv, 0, sizeof s->mla_rank_kv);
    // GDN (FLA rule used by HyLo): H*K = floor(0.75 d) in heads of 256, Dv = 2K.
    s->gdn = arch_gdn_hylo(t->d, dims->gdn_head_dim);
    if (dims->gdn_heads) s->gdn.n_heads = s->gdn.n_v_heads = dims->gdn_heads;
    // Mamba-2 (Zebra-Llama / MambaInLlama): one SSM head per attention head.
    s->m2 = arch_m2_from_attention(t);
    return arch_validate(s, "student");
}

// ---- helpers -------------------------------------------------------------------

// The teacher's attention weights of layer l, fp32 views into tw (read only):
// q, k, v, o, and q_norm, k_norm when it has them (Qwen3). An error names a
// missing tensor.
static int teacher_attn(const ptable_t *tpt, const float *tw, int l, attn_w_t *w) {
    int rc = attn_w_bind(w, tpt, (void *)tw, sizeof(float), l);
    return rc < 0 ? err_wrap(rc, "teacher: ") : 0;
}

// The teacher row (of W_q, or of a q_norm over one head when h = 0) of row j
// of MLA query head h: the nope part (j < d_nope) takes the head's first rows,
// the rope part its last d_rope rows.
static int q_src_row(int dh, const mla_dims_t *m, int h, int j) {
    return h * dh + (j < m->d_nope ? j : dh - m->d_rope + (j - m->d_nope));
}

static int copy_param(const ptable_t *tpt, const float *tw, const ptable_t *spt, float *sw, const char *name) {
    const param_t *a = ptable_find(tpt, name), *b = ptable_find(spt, name);
    if (!a || !b) return err_set(ERR_INPUT, "upcycle: parameter %s missing in the %s", name, a ? "student" : "teacher");
    if (a->numel != b->numel) return err_set(ERR_INPUT, "upcycle: parameter %s changes size", name);
    memcpy(sw + b->off, tw + a->off, (size_t)a->numel * sizeof(float));
    return 0;
}

int upc_svd(const float *A, int m, int n, int r, float *U, float *S, float *Vt, float *s_all) {
    int k = m < n ? m : n;
    if (r < 1 || r > k) return err_set(ERR_INPUT, "SVD rank %d out of range for a %d x %d matrix (max %d)", r, m, n, k);
    double *a = malloc((size_t)m * n * sizeof(double)), *s = malloc((size_t)k * sizeof(double));
    double *u = malloc((size_t)m * k * sizeof(double)), *vt = malloc((size_t)k * n * sizeof(double));
    int rc = 0;
    if (!a || !s || !u || !vt) rc = err_set(ERR_NOMEM, "out of memory for a %d x %d SVD", m, n);
    if (rc == 0) {
        for (int64_t i = 0; i < (int64_t)m * n; i++)
            a[i] = A[i];
        // double precision: the factors are exact to fp32 rounding. On every
        // thread: the CPU backend keeps OpenBLAS single-threaded (cpu.h
        // cpu_sgemm), which would leave LAPACK's products on one.
        const int blas_threads = openblas_get_num_threads();
        openblas_set_num_threads(omp_get_max_threads());
        lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', m, n, a, n, s, u, k, vt, n);
        openblas_set_num_threads(blas_threads);
        if (info != 0) rc = err_set(ERR_RUNTIME, "SVD of a %d x %d matrix failed (LAPACK info %d)", m, n, (int)info);
    }
    if (rc == 0) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < r; j++)
                U[(int64_t)i * r + j] = (float)u[(int64_t)i * k + j];
        for (int j = 0; j < r; j++)
            S[j] = (float)s[j];
        for (int j = 0; j < r; j++)
            for (int c = 0; c < n; c++)
                Vt[(int64_t)j * n + c] = (float)vt[(int64_t)j * n + c];
        if (s_all)
            for (int j = 0; j < k; j++)
                s_all[j] = (float)s[j];
    }
    free(a);
    free(s);
    free(u);
    free(vt);
    return rc;
}

// PyTorch nn.Linear / nn.Conv1d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
static void fill_kaiming(rng_t *r, float *w, int64_t n, int64_t fan_in) {
    float b = 1.0f / sqrtf((float)fan_in);
    rng_fill_uniform(r, w, n, -b, b);
}

// dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1], floored at 1e-4.
static void fill_dt_bias(rng_t *r, float *w, int n) {
    for (int i = 0; i < n; i++) {
        double dt = exp(rng_uniform(r) * (log(0.1) - log(0.001)) + log(0.001));
        if (dt < 1e-4) dt = 1e-4;
        w[i] = (float)(dt + log(-expm1(-dt)));
    }
}

static void fill_const(float *w, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++)
        w[i] = v;
}

// ---- MLA (truncated SVD, hybrid_model.md §4) -------------------------------------

int upc_mla_from_attention(const arch_t *t, const ptable_t *tpt, const float *tw, const arch_t *s, const ptable_t *spt,
                           float *sw, int l) {
    const mla_dims_t *m = &s->mla;
    int d = t->d, H = t->H, Hkv = t->Hkv, dh = t->dh, n = m->d_nope, p = m->d_rope, v = m->d_v, G = m->n_kv;
    int rq = arch_mla_rq(s, l), rkv = arch_mla_rkv(s, l), qd = n + p;
    if (G % Hkv) return err_set(ERR_INPUT, "MLA kv heads %d must be a multiple of the teacher's %d", G, Hkv);
    attn_w_t ta;
    mla_w_t st; // the student's views (float)
    TRY(teacher_attn(tpt, tw, l, &ta));
    TRY(mla_w_bind(&st, spt, sw, sizeof(float), l));
    if (rq > 0 ? !(st.q_a && st.q_b) : !st.q_proj)
        return err_set(ERR_INPUT, "MLA layer %d: the student has no %s", l, rq > 0 ? "q_a_proj + q_b_proj" : "q_proj");
    const float *Wq = ta.q, *Wk = ta.k, *Wv = ta.v, *Wo = ta.o;
    int rc = 0;
    // Query: W_q = U S V^T; q_a = S_r V_r^T; q_b rows per head: the first n and
    // the last p rows of that head's block of U_r.
    if (rq > 0) {
        float *U = malloc((size_t)H * dh * rq * sizeof(float)), *S = malloc((size_t)rq * sizeof(float));
        float *Vt = malloc((size_t)rq * d * sizeof(float));
        float *qa = st.q_a, *qb = st.q_b;
        if (!U || !S || !Vt) rc = err_set(ERR_NOMEM, "out of memory");
        if (rc == 0) rc = upc_svd(Wq, H * dh, d, rq, U, S, Vt, NULL);
        if (rc == 0) {
            for (int i = 0; i < rq; i++)
                for (int c = 0; c < d; c++)
                    qa[(int64_t)i * d + c] = S[i] * Vt[(int64_t)i * d + c];
            for (int h = 0; h < H; h++)
                for (int j = 0; j < qd; j++)
                    memcpy(qb + ((int64_t)h * qd + j) * rq, U + (int64_t)q_src_row(dh, m, h, j) * rq,
                           (size_t)rq * sizeof(float));
        }
        free(U);
        free(S);
        free(Vt);
        if (rc < 0) return rc;
    } else {
        float *q = st.q_proj;
        for (int h = 0; h < H; h++)
            for (int j = 0; j < qd; j++)
                memcpy(q + ((int64_t)h * qd + j) * d, Wq + (int64_t)q_src_row(dh, m, h, j) * d,
                       (size_t)d * sizeof(float));
    }
    // Keys and values share one latent: W_kv = [K'; V'] with the teacher's KV
    // heads repeated to G heads; kv_a = [S_r V_r^T ; head-mean of K's last p rows].
    int grp = G / Hkv, rows = 2 * G * dh;
    float *Wkv = malloc((size_t)rows * d * sizeof(float));
    float *U = malloc((size_t)rows * rkv * sizeof(float)), *S = malloc((size_t)rkv * sizeof(float));
    float *Vt = malloc((size_t)rkv * d * sizeof(float));
    if (!Wkv || !U || !S || !Vt) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) {
        for (int g = 0; g < G; g++) {
            memcpy(Wkv + (int64_t)g * dh * d, Wk + (int64_t)(g / grp) * dh * d, (size_t)dh * d * sizeof(float));
            memcpy(Wkv + (int64_t)(G + g) * dh * d, Wv + (int64_t)(g / grp) * dh * d, (size_t)dh * d * sizeof(float));
        }
        rc = upc_svd(Wkv, rows, d, rkv, U, S, Vt, NULL);
    }
    if (rc == 0) {
        float *kva = st.kv_a, *kvb = st.kv_b;
        for (int i = 0; i < rkv; i++)
            for (int c = 0; c < d; c++)
                kva[(int64_t)i * d + c] = S[i] * Vt[(int64_t)i * d + c];
        for (int j = 0; j < p; j++)
            for (int c = 0; c < d; c++) {
                double acc = 0;
                for (int h = 0; h < Hkv; h++)
                    acc += Wk[((int64_t)h * dh + dh - p + j) * d + c];
                kva[(int64_t)(rkv + j) * d + c] = (float)(acc / Hkv);
            }
        for (int g = 0; g < G; g++) {
            for (int j = 0; j < n; j++) // k_nope: the first n rows of the head's K block
                memcpy(kvb + ((int64_t)g * (n + v) + j) * rkv, U + ((int64_t)g * dh + j) * rkv,
                       (size_t)rkv * sizeof(float));
            for (int j = 0; j < v; j++) // value: the head's V block
                memcpy(kvb + ((int64_t)g * (n + v) + n + j) * rkv, U + ((int64_t)(G + g) * dh + j) * rkv,
                       (size_t)rkv * sizeof(float));
        }
        // out_proj from o_proj: the first v input columns of each head.
        float *o = st.o;
        for (int r = 0; r < d; r++)
            for (int h = 0; h < H; h++)
                memcpy(o + (int64_t)r * H * v + (int64_t)h * v, Wo + (int64_t)r * H * dh + (int64_t)h * dh,
                       (size_t)v * sizeof(float));
        if (st.q_a_norm) fill_const(st.q_a_norm, rq, 1.0f);
        if (st.kv_a_norm) fill_const(st.kv_a_norm, rkv, 1.0f);
        float *qn = st.q_norm, *kn = st.k_norm;
        const float *tqn = ta.q_norm, *tkn = ta.k_norm;
        if (qn && tqn)
            for (int j = 0; j < qd; j++)
                qn[j] = tqn[q_src_row(dh, m, 0, j)];
        if (kn && tkn)
            for (int j = 0; j < p; j++)
                kn[j] = tkn[dh - p + j];
    }
    free(Wkv);
    free(U);
    free(S);
    free(Vt);
    return rc;
}

// ---- Gated DeltaNet (hylo_recipe.md §2) ----------------------------------------

static int gdn_from_attention(const arch_t *t, const ptable_t *tpt, const float *tw, const arch_t *s,
                              const ptable_t *spt, float *sw, int l, rng_t *r) {
    const gdn_dims_t *g = &s->gdn;
    int d = t->d, H = t->H, Hkv = t->Hkv, dh = t->dh, rep = H / Hkv;
    int64_t kd = (int64_t)g->n_heads * g->head_k, vd = (int64_t)g->n_v_heads * g->head_v, qw = (int64_t)H * dh;
    attn_w_t ta;
    gdn_w_t st; // the student's views (float)
    TRY(teacher_attn(tpt, tw, l, &ta));
    TRY(gdn_w_bind(&st, spt, sw, sizeof(float), l));
    if (g->use_gate && !st.g_proj) return err_set(ERR_INPUT, "GDN layer %d: use_gate without g_proj", l);
    const float *Wq = ta.q, *Wk = ta.k, *Wv = ta.v, *Wo = ta.o;
    float *q = st.q_proj, *k = st.k_proj, *v = st.v_proj, *o = st.o_proj;
    // Rows with no teacher counterpart keep the default init; then the overlap is copied.
    fill_kaiming(r, q, kd * d, d);
    fill_kaiming(r, k, kd * d, d);
    fill_kaiming(r, v, vd * d, d);
    fill_kaiming(r, o, (int64_t)d * vd, vd);
    int64_t nq = kd < qw ? kd : qw, nv = vd < qw ? vd : qw;
    memcpy(q, Wq, (size_t)nq * d * sizeof(float));
    // K and V after GQA expansion: expanded row i is teacher row (i / dh / rep) * dh + i % dh.
    for (int64_t i = 0; i < nq; i++)
        memcpy(k + i * d, Wk + ((i / dh) / rep * dh + i % dh) * d, (size_t)d * sizeof(float));
    for (int64_t i = 0; i < nv; i++)
        memcpy(v + i * d, Wv + ((i / dh) / rep * dh + i % dh) * d, (size_t)d * sizeof(float));
    for (int rr = 0; rr < d; rr++)
        memcpy(o + (int64_t)rr * vd, Wo + (int64_t)rr * qw, (size_t)nv * sizeof(float));
    fill_kaiming(r, st.a_proj, (int64_t)g->n_v_heads * d, d);
    fill_kaiming(r, st.b_proj, (int64_t)g->n_v_heads * d, d);
    if (g->use_gate) fill_kaiming(r, st.g_proj, vd * d, d);
    float *A_log = st.A_log;
    for (int i = 0; i < g->n_v_heads; i++) { // A ~ U(0, 16) (FLA), A_log = ln A
        float u = rng_uniform(r) * 16.0f;
        A_log[i] = logf(u > 1e-6f ? u : 1e-6f);
    }
    fill_dt_bias(r, st.dt_bias, g->n_v_heads);
    fill_kaiming(r, st.q_conv, kd * g->conv, g->conv);
    fill_kaiming(r, st.k_conv, kd * g->conv, g->conv);
    fill_kaiming(r, st.v_conv, vd * g->conv, g->conv);
    fill_const(st.o_norm, g->head_v, 1.0f);
    return 0;
}

// ---- Mamba-2 (MambaInLlama, linear_blocks.md §4.2) --------------------------------

static int m2_from_attention(const arch_t *t, const ptable_t *tpt, const float *tw, const arch_t *s,
                             const ptable_t *spt, float *sw, int l, rng_t *r) {
    const m2_dims_t *m = &s->m2;
    int d = t->d;
    if (m->d_inner != t->H * t->dh || m->d_xb != t->Hkv * t->dh)
        return err_set(ERR_INPUT, "Mamba-2 init needs d_inner = H*dh (%d) and d_xb = Hkv*dh (%d)", t->H * t->dh,
                       t->Hkv * t->dh);
    attn_w_t ta;
    m2_w_t st; // the student's views (float)
    TRY(teacher_attn(tpt, tw, l, &ta));
    TRY(m2_w_bind(&st, spt, sw, sizeof(float), l));
    float *in = st.in_proj;
    int64_t di = m->d_inner, dxb = m->d_xb, conv_dim = di + 2 * dxb;
    fill_kaiming(r, in, di * d, d);                                           // z
    memcpy(in + di * d, ta.v, (size_t)dxb * d * sizeof(float));               // x <- W_V
    memcpy(in + (di + dxb) * d, ta.k, (size_t)dxb * d * sizeof(float));       // B <- W_K
    memcpy(in + (di + 2 * dxb) * d, ta.q, (size_t)di * d * sizeof(float));    // C <- W_Q
    fill_kaiming(r, in + (2 * di + 2 * dxb) * d, (int64_t)m->n_heads * d, d); // dt
    fill_kaiming(r, st.conv_w, conv_dim * m->conv, m->conv);
    fill_kaiming(r, st.conv_b, conv_dim, m->conv);
    fill_dt_bias(r, st.dt_bias, m->n_heads);
    float *A_log = st.A_log;
    for (int i = 0; i < m->n_heads; i++)
        A_log[i] = logf(rng_range(r, 1.0f, 16.0f));
    fill_const(st.D, m->n_heads, 1.0f);
    fill_const(st.norm, di, 1.0f);
    memcpy(st.out_proj, ta.o, (size_t)d * di * sizeof(float));
    return 0;
}

// ---- whole model -------------------------------------------------------------------

int upc_convert(const arch_t *t, const ptable_t *tpt, const float *tw, const arch_t *s, const ptable_t *spt, float *sw,
                uint64_t seed) {
    TRY(copy_param(tpt, tw, spt, sw, "model.embed_tokens.weight"));
    TRY(copy_param(tpt, tw, spt, sw, "model.norm.weight"));
    if (ptable_find(spt, "lm_head.weight"))
        TRY(copy_param(tpt, tw, spt, sw,
                       ptable_find(tpt, "lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight"));
    char name[128];
    static const char *shared[] = {"input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                                   "mlp.up_proj.weight", "mlp.down_proj.weight"};
    for (int l = 0; l < s->n_layers; l++) {
        for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, shared[i]);
            TRY(copy_param(tpt, tw, spt, sw, name));
        }
        rng_t r; // one stream per layer: a layer's init does not depend on the others
        rng_seed(&r, seed * 1000003ull + (uint64_t)l);
        int rc = 0;
        switch (s->kind[l]) {
        case LAYER_ATTN: { // kept as attention: every self_attn tensor verbatim
            static const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"};
            for (size_t i = 0; i < sizeof attn / sizeof attn[0] && rc == 0; i++) {
                snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, attn[i]);
                if (ptable_find(spt, name)) rc = copy_param(tpt, tw, spt, sw, name);
            }
            break;
        }
        case LAYER_MLA: rc = upc_mla_from_attention(t, tpt, tw, s, spt, sw, l); break;
        case LAYER_GDN: rc = gdn_from_attention(t, tpt, tw, s, spt, sw, l, &r); break;
        case LAYER_M2: rc = m2_from_attention(t, tpt, tw, s, spt, sw, l, &r); break;
        }
        if (rc < 0) return err_wrap(rc, "layer %d (%s): ", l, layer_kind_name(s->kind[l]));
    }
    return 0;
}
