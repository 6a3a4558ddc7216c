#include "model/arch.h"

#include <stdio.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"

void arch_init(arch_t *a) {
    memset(a, 0, sizeof *a);
    strcpy(a->model_type, "llama");
    a->eps = 1e-5f;
    a->rope.theta = 10000.0f;
    a->rope.beta_fast = 32.0f;
    a->rope.beta_slow = 1.0f;
    a->rope.mscale = 1.0f;
    a->bos_id = a->eos_id = a->pad_id = -1;
    a->mla.rope = a->rope;
    a->gdn.conv = 4;
    a->gdn.use_gate = 1;
    a->gdn.norm_eps = 1e-6f;
    a->m2.conv = 4;
    a->m2.chunk = 256;
    a->m2.norm_eps = 1e-5f;
}

const char *layer_kind_name(layer_kind_t k) {
    switch (k) {
    case LAYER_ATTN: return "attention";
    case LAYER_MLA: return "MLA";
    case LAYER_GDN: return "GDN";
    case LAYER_M2: return "Mamba-2";
    }
    return "?";
}

int arch_count(const arch_t *a, layer_kind_t k) {
    int n = 0;
    for (int l = 0; l < a->n_layers; l++)
        n += a->kind[l] == k;
    return n;
}

int arch_mla_rq(const arch_t *a, int l) { return a->mla_rank_q[l] ? a->mla_rank_q[l] : a->mla.r_q; }
int arch_mla_rkv(const arch_t *a, int l) { return a->mla_rank_kv[l] ? a->mla_rank_kv[l] : a->mla.r_kv; }

gdn_dims_t arch_gdn_hylo(int d, int head_k) {
    gdn_dims_t g = {.head_k = head_k > 0 ? head_k : 256, .conv = 4, .use_gate = 1, .norm_eps = 1e-6f};
    g.n_heads = (int)((int64_t)3 * d / 4) / g.head_k;
    if (g.n_heads < 1) g.n_heads = 1;
    g.n_v_heads = g.n_heads;
    g.head_v = 2 * g.head_k;
    return g;
}

m2_dims_t arch_m2_from_attention(const arch_t *t) {
    return (m2_dims_t){.d_inner = t->H * t->dh,
                       .d_xb = t->Hkv * t->dh,
                       .n_heads = t->H,
                       .headdim = t->dh,
                       .d_state = t->dh,
                       .conv = 4,
                       .chunk = 256,
                       .norm_eps = 1e-5f};
}

#define NEED(cond, ...)                                                                                                \
    do {                                                                                                               \
        if (!(cond)) return err_set(ERR_INPUT, __VA_ARGS__);                                                           \
    } while (0)

// A RoPE's frequencies and scaling (pre: "" for the teacher attention's,
// "MLA " for the MLA layers'), with the HF field names in messages. rot: the
// rotated dims (dh, or d_rope), whose half a GGUF rope_freqs tensor covers.
static int rope_validate(const rope_cfg_t *r, const char *src, const char *pre, int rot) {
    char f[96];
    snprintf(f, sizeof f, "%srope_theta", pre);
    TRY(ck_positive(src, f, r->theta, LIM_ROPE_THETA));
    if (r->scaling != ROPE_SCALE_NONE) {
        snprintf(f, sizeof f, "%srope_scaling.factor", pre);
        TRY(ck_positive(src, f, r->factor, LIM_ROPE_FACTOR));
    }
    if (r->scaling != ROPE_SCALE_NONE && r->scaling != ROPE_SCALE_LINEAR && r->scaling != ROPE_SCALE_LLAMA3 &&
        r->scaling != ROPE_SCALE_YARN)
        return err_set(ERR_INPUT, "%s: %srope scaling kind %d is unknown", src, pre, (int)r->scaling);
    if (r->scaling == ROPE_SCALE_LLAMA3) {
        snprintf(f, sizeof f, "%srope_scaling.low_freq_factor", pre);
        TRY(ck_positive(src, f, r->low_freq_factor, LIM_ROPE_FACTOR));
        snprintf(f, sizeof f, "%srope_scaling.high_freq_factor", pre);
        TRY(ck_positive(src, f, r->high_freq_factor, LIM_ROPE_FACTOR));
        NEED(r->high_freq_factor > r->low_freq_factor,
             "%s: %srope_scaling.high_freq_factor %g must exceed low_freq_factor %g", src, pre, r->high_freq_factor,
             r->low_freq_factor);
    }
    if (r->scaling == ROPE_SCALE_LLAMA3 || r->scaling == ROPE_SCALE_YARN) {
        snprintf(f, sizeof f, "%srope_scaling.original_max_position_embeddings", pre);
        TRY(ck_int(src, f, r->orig_max_pos, 1, LIM_POS));
    }
    if (r->scaling == ROPE_SCALE_YARN) {
        snprintf(f, sizeof f, "%srope_scaling.beta_fast", pre);
        TRY(ck_positive(src, f, r->beta_fast, LIM_ROPE_FACTOR));
        snprintf(f, sizeof f, "%srope_scaling.beta_slow", pre);
        TRY(ck_positive(src, f, r->beta_slow, LIM_ROPE_FACTOR));
        snprintf(f, sizeof f, "%srope_scaling.mscale", pre);
        TRY(ck_real(src, f, r->mscale, -LIM_ROPE_FACTOR, LIM_ROPE_FACTOR));
        snprintf(f, sizeof f, "%srope_scaling.mscale_all_dim", pre);
        TRY(ck_real(src, f, r->mscale_all_dim, -LIM_ROPE_FACTOR, LIM_ROPE_FACTOR));
        snprintf(f, sizeof f, "%srope_scaling.attention_factor", pre);
        TRY(ck_real(src, f, r->attn_factor, 0, LIM_ROPE_FACTOR));
    }
    // GGUF rope_freqs divisors: one per rotated pair, each a positive finite number.
    NEED(r->n_freq_div == 0 || (r->n_freq_div == rot / 2 && r->n_freq_div <= 128),
         "%s: %srope_freqs has %d values, expected head_dim/2 = %d (at most 128)", src, pre, r->n_freq_div, rot / 2);
    for (int i = 0; i < r->n_freq_div; i++) {
        snprintf(f, sizeof f, "%srope_freqs[%d]", pre, i);
        TRY(ck_positive(src, f, r->freq_div[i], LIM_ROPE_FACTOR));
    }
    return 0;
}

// Every size is held to its limit (base/checked.h) before any product of
// sizes is formed, and every product is formed in 64 bits and held to
// LIM_WIDTH: after this, int arithmetic on two dimensions cannot overflow.
int arch_validate(const arch_t *a, const char *src) {
    int64_t w, w2;
    TRY(ck_int(src, "hidden_size", a->d, 1, LIM_DIM));
    TRY(ck_int(src, "num_hidden_layers", a->n_layers, 1, ARCH_MAX_LAYERS));
    TRY(ck_int(src, "num_attention_heads", a->H, 1, LIM_DIM));
    TRY(ck_int(src, "num_key_value_heads", a->Hkv, 1, LIM_DIM));
    NEED(a->H % a->Hkv == 0, "%s: num_attention_heads %d must be a positive multiple of num_key_value_heads %d", src,
         a->H, a->Hkv);
    TRY(ck_int(src, "head_dim", a->dh, 2, LIM_DIM));
    NEED(a->dh % 2 == 0, "%s: head_dim %d must be positive and even", src, a->dh);
    TRY(ck_mul(src, "num_attention_heads x head_dim", a->H, a->dh, LIM_WIDTH, &w));
    TRY(ck_int(src, "intermediate_size", a->ffn, 1, LIM_DIM));
    TRY(ck_int(src, "vocab_size", a->V, 1, LIM_VOCAB));
    TRY(ck_int(src, "max_position_embeddings", a->max_pos, 0, LIM_POS));
    TRY(ck_positive(src, "rms_norm_eps", a->eps, 1));
    TRY(rope_validate(&a->rope, src, "", a->dh));
    int n_mla = arch_count(a, LAYER_MLA), n_gdn = arch_count(a, LAYER_GDN), n_m2 = arch_count(a, LAYER_M2);
    for (int l = 0; l < a->n_layers; l++)
        if (a->kind[l] != LAYER_ATTN && a->kind[l] != LAYER_MLA && a->kind[l] != LAYER_GDN && a->kind[l] != LAYER_M2)
            return err_set(ERR_INPUT, "%s: layer %d: unknown kind %d", src, l, (int)a->kind[l]);
    if (n_mla) {
        const mla_dims_t *m = &a->mla;
        NEED(m->d_rope > 0 && m->d_rope % 2 == 0 && m->d_rope <= 256,
             "%s: qk_rope_head_dim %d must be even and in 2..256", src, m->d_rope);
        TRY(ck_int(src, "qk_nope_head_dim", m->d_nope, 0, LIM_DIM));
        TRY(ck_int(src, "v_head_dim", m->d_v, 1, LIM_DIM));
        TRY(ck_int(src, "MLA num_key_value_heads", m->n_kv, 1, LIM_DIM));
        NEED(a->H % m->n_kv == 0, "%s: MLA num_key_value_heads %d must divide num_attention_heads %d", src, m->n_kv,
             a->H);
        TRY(ck_mul(src, "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)", a->H,
                   (int64_t)m->d_nope + m->d_rope, LIM_WIDTH, &w));
        TRY(ck_mul(src, "MLA num_key_value_heads x (qk_nope_head_dim + v_head_dim)", m->n_kv,
                   (int64_t)m->d_nope + m->d_v, LIM_WIDTH, &w));
        TRY(ck_mul(src, "num_attention_heads x v_head_dim", a->H, m->d_v, LIM_WIDTH, &w));
        for (int l = 0; l < a->n_layers; l++) {
            if (a->kind[l] != LAYER_MLA) continue;
            char f[64];
            snprintf(f, sizeof f, "layer %d: kv_lora_rank", l);
            TRY(ck_int(src, f, arch_mla_rkv(a, l), 1, LIM_DIM));
            snprintf(f, sizeof f, "layer %d: q_lora_rank", l);
            TRY(ck_int(src, f, arch_mla_rq(a, l), 0, LIM_DIM));
        }
        TRY(rope_validate(&m->rope, src, "MLA ", m->d_rope));
    }
    if (n_gdn) {
        const gdn_dims_t *g = &a->gdn;
        TRY(ck_int(src, "GDN num_heads", g->n_heads, 1, LIM_DIM));
        TRY(ck_int(src, "GDN num_v_heads", g->n_v_heads, 1, LIM_DIM));
        TRY(ck_int(src, "GDN head_dim", g->head_k, 1, LIM_DIM));
        TRY(ck_int(src, "GDN value head dim (head_dim x expand_v)", g->head_v, 1, LIM_DIM));
        NEED(g->n_v_heads % g->n_heads == 0, "%s: GDN num_v_heads %d must be a multiple of num_heads %d", src,
             g->n_v_heads, g->n_heads);
        TRY(ck_mul(src, "GDN num_heads x head_dim", g->n_heads, g->head_k, LIM_WIDTH, &w));
        TRY(ck_mul(src, "GDN num_v_heads x value head dim", g->n_v_heads, g->head_v, LIM_WIDTH, &w));
        TRY(ck_mul(src, "GDN state (num_v_heads x value head dim x head_dim)", w, g->head_k, LIM_NUMEL, &w2));
        NEED(g->conv >= 1 && g->conv <= 8, "%s: GDN conv_size %d out of range 1..8", src, g->conv);
        TRY(ck_positive(src, "gdn_cfg.norm_eps", g->norm_eps, 1));
    }
    if (n_m2) {
        const m2_dims_t *m = &a->m2;
        TRY(ck_int(src, "Mamba-2 heads (ssm_cfg.ngroups)", m->n_heads, 1, LIM_DIM));
        TRY(ck_int(src, "Mamba-2 d_state (ssm_cfg.d_state)", m->d_state, 1, LIM_DIM));
        TRY(ck_int(src, "Mamba-2 headdim (= ssm_cfg.d_state)", m->headdim, 1, LIM_DIM));
        TRY(ck_int(src, "d_inner", m->d_inner, 1, LIM_DIM));
        TRY(ck_int(src, "d_xb", m->d_xb, 0, LIM_DIM));
        NEED((int64_t)m->d_inner == (int64_t)m->n_heads * m->headdim,
             "%s: Mamba-2 d_inner %d != n_heads %d x headdim %d", src, m->d_inner, m->n_heads, m->headdim);
        NEED(m->d_xb >= m->headdim && m->d_xb % m->headdim == 0 && m->d_xb % m->d_state == 0 &&
                 m->n_heads % (m->d_xb / m->headdim) == 0,
             "%s: Mamba-2 d_xb %d must be a whole number of heads dividing n_heads", src, m->d_xb);
        // B groups (d_xb / d_state) and C groups (d_inner / d_state) of the
        // SSD must each serve an equal share of the heads too: a check of
        // their own when d_state != headdim.
        NEED(m->d_inner % m->d_state == 0 && m->n_heads % (m->d_xb / m->d_state) == 0 &&
                 m->n_heads % (m->d_inner / m->d_state) == 0,
             "%s: Mamba-2 B and C groups (d_xb %d, d_inner %d over d_state %d) must divide n_heads %d", src, m->d_xb,
             m->d_inner, m->d_state, m->n_heads);
        TRY(ck_mul(src, "Mamba-2 state (d_inner x d_state)", m->d_inner, m->d_state, LIM_NUMEL, &w));
        NEED(m->conv >= 1 && m->conv <= 8, "%s: Mamba-2 d_conv %d out of range 1..8", src, m->conv);
        TRY(ck_positive(src, "Mamba-2 norm eps", m->norm_eps, 1));
    }
    return 0;
}

int arch_cache_parts(const arch_t *a, int l, int64_t B, int64_t cap, int elt_state, int elt, int64_t part[4]) {
    switch (a->kind[l]) {
    case LAYER_ATTN: part[0] = part[1] = B * cap * a->Hkv * a->dh * elt; return 2;
    case LAYER_MLA: part[0] = B * cap * (arch_mla_rkv(a, l) + a->mla.d_rope) * elt; return 1;
    case LAYER_GDN: {
        const gdn_dims_t *g = &a->gdn;
        int64_t kd = (int64_t)g->n_heads * g->head_k, vd = (int64_t)g->n_v_heads * g->head_v;
        part[0] = B * g->n_v_heads * g->head_v * g->head_k * elt_state;
        part[1] = part[2] = B * kd * g->conv * elt;
        part[3] = B * vd * g->conv * elt;
        return 4;
    }
    case LAYER_M2: {
        const m2_dims_t *m = &a->m2;
        part[0] = B * m->n_heads * m->headdim * m->d_state * elt_state;
        part[1] = B * (m->d_inner + 2 * m->d_xb) * m->conv * elt;
        return 2;
    }
    default: return 0;
    }
}

int arch_cache_grows(const arch_t *a, int l) { return a->kind[l] == LAYER_ATTN || a->kind[l] == LAYER_MLA; }

// Sum of the parts of the layers whose cache grows with the tokens (grows = 1)
// or stays fixed (grows = 0), for one sequence of one token.
static int64_t cache_bytes(const arch_t *a, int grows, int elt_state, int elt) {
    int64_t n = 0, part[4];
    for (int l = 0; l < a->n_layers; l++) {
        if (arch_cache_grows(a, l) != grows) continue;
        int np = arch_cache_parts(a, l, 1, 1, elt_state, elt, part);
        for (int i = 0; i < np; i++)
            n += part[i];
    }
    return n;
}

int64_t arch_cache_bytes_per_token(const arch_t *a, int elt) { return cache_bytes(a, 1, elt, elt); }

int64_t arch_state_bytes(const arch_t *a, int elt_state, int elt_conv) {
    return cache_bytes(a, 0, elt_state, elt_conv);
}
