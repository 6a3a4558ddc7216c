#include "model/arch.h"

#include <string.h>

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

int arch_validate(const arch_t *a, const char *src) {
    NEED(a->d > 0, "%s: hidden_size must be positive (got %d)", src, a->d);
    NEED(a->n_layers > 0 && a->n_layers <= ARCH_MAX_LAYERS, "%s: num_hidden_layers %d out of range 1..%d", src,
         a->n_layers, ARCH_MAX_LAYERS);
    NEED(a->H > 0 && a->Hkv > 0 && a->H % a->Hkv == 0,
         "%s: num_attention_heads %d must be a positive multiple of num_key_value_heads %d", src, a->H, a->Hkv);
    NEED(a->dh > 0 && a->dh % 2 == 0, "%s: head_dim %d must be positive and even", src, a->dh);
    NEED(a->ffn > 0, "%s: intermediate_size must be positive (got %d)", src, a->ffn);
    NEED(a->V > 0, "%s: vocab_size must be positive (got %d)", src, a->V);
    NEED(a->eps > 0, "%s: rms_norm_eps must be positive", src);
    NEED(a->rope.theta > 0, "%s: rope_theta must be positive", src);
    for (int l = 0; l < a->n_layers; l++) {
        switch (a->kind[l]) {
        case LAYER_ATTN: break;
        case LAYER_MLA:
            NEED(arch_mla_rkv(a, l) > 0, "%s: layer %d: kv_lora_rank must be positive", src, l);
            NEED(arch_mla_rq(a, l) >= 0, "%s: layer %d: q_lora_rank must be >= 0", src, l);
            NEED(a->mla.d_rope > 0 && a->mla.d_rope % 2 == 0 && a->mla.d_rope <= 256,
                 "%s: qk_rope_head_dim %d must be even and in 2..256", src, a->mla.d_rope);
            NEED(a->mla.d_nope >= 0 && a->mla.d_v > 0, "%s: qk_nope_head_dim / v_head_dim out of range", src);
            NEED(a->mla.n_kv > 0 && a->H % a->mla.n_kv == 0,
                 "%s: MLA num_key_value_heads %d must divide num_attention_heads %d", src, a->mla.n_kv, a->H);
            break;
        case LAYER_GDN:
            NEED(a->gdn.n_heads > 0 && a->gdn.head_k > 0 && a->gdn.head_v > 0,
                 "%s: GDN num_heads / head_dim / value head dim must be positive", src);
            NEED(a->gdn.n_v_heads % a->gdn.n_heads == 0, "%s: GDN num_v_heads %d must be a multiple of num_heads %d",
                 src, a->gdn.n_v_heads, a->gdn.n_heads);
            NEED(a->gdn.conv >= 1 && a->gdn.conv <= 8, "%s: GDN conv_size %d out of range 1..8", src, a->gdn.conv);
            break;
        case LAYER_M2:
            NEED(a->m2.n_heads > 0 && a->m2.headdim > 0 && a->m2.d_state > 0,
                 "%s: Mamba-2 heads / headdim / d_state must be positive", src);
            NEED(a->m2.d_inner == a->m2.n_heads * a->m2.headdim, "%s: Mamba-2 d_inner %d != n_heads %d x headdim %d",
                 src, a->m2.d_inner, a->m2.n_heads, a->m2.headdim);
            NEED(a->m2.d_xb >= a->m2.headdim && a->m2.d_xb % a->m2.headdim == 0 && a->m2.d_xb % a->m2.d_state == 0 &&
                     a->m2.n_heads % (a->m2.d_xb / a->m2.headdim) == 0,
                 "%s: Mamba-2 d_xb %d must be a whole number of heads dividing n_heads", src, a->m2.d_xb);
            // B groups (d_xb / d_state) and C groups (d_inner / d_state) of the
            // SSD must each serve an equal share of the heads too: a check of
            // their own when d_state != headdim.
            NEED(a->m2.d_inner % a->m2.d_state == 0 && a->m2.n_heads % (a->m2.d_xb / a->m2.d_state) == 0 &&
                     a->m2.n_heads % (a->m2.d_inner / a->m2.d_state) == 0,
                 "%s: Mamba-2 B and C groups (d_xb %d, d_inner %d over d_state %d) must divide n_heads %d", src,
                 a->m2.d_xb, a->m2.d_inner, a->m2.d_state, a->m2.n_heads);
            NEED(a->m2.conv >= 1 && a->m2.conv <= 8, "%s: Mamba-2 d_conv %d out of range 1..8", src, a->m2.conv);
            break;
        default: return err_set(ERR_INPUT, "%s: layer %d: unknown kind %d", src, l, (int)a->kind[l]);
        }
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

// Sum of the parts of the layers whose cache grows with the tokens (grows = 1)
// or stays fixed (grows = 0), for one sequence of one token.
static int64_t cache_bytes(const arch_t *a, int grows, int elt_state, int elt) {
    int64_t n = 0, part[4];
    for (int l = 0; l < a->n_layers; l++) {
        if ((a->kind[l] == LAYER_ATTN || a->kind[l] == LAYER_MLA) != grows) continue;
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
