// Architecture as data: one struct describes any supported model, teacher or
// hybrid student. Per layer a kind (ATTN, MLA, GDN, M2) with that kind's
// dimensions; everything else (MLP, norms, embedding, head) is shared.
// Filled by io/config.c (HF config.json + hybrid_config.json) or io/gguf_model.c
// (GGUF metadata); turned into a parameter table by model/params.c.
#pragma once
#include <stdint.h>

#define ARCH_MAX_LAYERS 256

typedef enum { LAYER_ATTN = 0, LAYER_MLA = 1, LAYER_GDN = 2, LAYER_M2 = 3 } layer_kind_t;

typedef enum { ROPE_SCALE_NONE = 0, ROPE_SCALE_LLAMA3 = 1, ROPE_SCALE_YARN = 2, ROPE_SCALE_LINEAR = 3 } rope_scale_t;

// RoPE frequencies and their scaling (model/rope.c builds the tables).
typedef struct {
    float theta; // base
    rope_scale_t scaling;
    float factor;                 // llama3 / yarn / linear
    float low_freq_factor;        // llama3
    float high_freq_factor;       // llama3
    int orig_max_pos;             // llama3 / yarn original_max_position_embeddings
    float beta_fast, beta_slow;   // yarn (defaults 32, 1)
    float mscale, mscale_all_dim; // yarn DeepSeek-style (defaults 1, 0)
    float attn_factor;            // HF yarn attention_factor (0 = default 0.1 ln(factor) + 1)
    int n_freq_div;               // GGUF rope_freqs tensor (Llama 3.1 scaling stored as per-frequency
    float freq_div[128];          // divisors): inv_freq[i] /= freq_div[i] when n_freq_div == dr/2
} rope_cfg_t;

// Multi-head Latent Attention (DeepSeek-V2/V3 as in Zebra-Llama / X-EcoMLA).
typedef struct {
    int r_q;         // q_lora_rank; 0 = plain q_proj [H*(d_nope+d_rope), d]
    int r_kv;        // kv_lora_rank
    int d_nope;      // qk_nope_head_dim
    int d_rope;      // qk_rope_head_dim
    int d_v;         // v_head_dim
    int n_kv;        // KV heads G of kv_b_proj (Zebra: teacher's Hkv; X-EcoMLA / use_full_kv_head: H)
    int latent_norm; // use_lora_layer_norm: RMSNorm (eps 1e-6) on the q and kv latents
    rope_cfg_t rope; // the MLA rope part's frequencies (YaRN in HyLo / Zebra)
} mla_dims_t;

// Gated DeltaNet (flash-linear-attention GatedDeltaNet).
typedef struct {
    int n_heads;   // H (q/k heads)
    int n_v_heads; // HV (value heads, = H unless GVA)
    int head_k;    // K (256 in HyLo)
    int head_v;    // Dv = K * expand_v
    int conv;      // short conv width W (4)
    int use_gate;  // g_proj + gated norm (1 in HyLo)
    int allow_neg_eigval;
    float norm_eps; // output norm eps
} gdn_dims_t;

// Mamba-2 (Zebra-Llama / MambaInLlama layout: in_proj z | x | B | C | dt).
typedef struct {
    int d_inner;    // z and C width (= H * headdim)
    int d_xb;       // x and B width (= Hkv * headdim)
    int n_heads;    // SSM heads (= ngroups = teacher's H)
    int headdim;    // P (= d_state = teacher's head dim)
    int d_state;    // N
    int conv;       // W (4)
    int chunk;      // SSD chunk (256)
    float norm_eps; // gated norm eps (1e-5)
} m2_dims_t;

typedef struct {
    char model_type[32]; // "llama", "qwen3"
    int d;               // hidden_size
    int n_layers;
    int H;     // num_attention_heads
    int Hkv;   // num_key_value_heads
    int dh;    // head_dim
    int ffn;   // intermediate_size
    int V;     // vocab_size
    float eps; // rms_norm_eps
    int tie_embeddings;
    int qk_norm;     // Qwen3: RMSNorm over dh on q and k after the projections
    int max_pos;     // max_position_embeddings (for reference only)
    rope_cfg_t rope; // the teacher attention's RoPE
    int bos_id, eos_id, pad_id;
    int n_eos; // eos_ids[0..n_eos): every end-of-sequence id of the config (eos_ids[0] == eos_id)
    int eos_ids[8];

    // per layer
    layer_kind_t kind[ARCH_MAX_LAYERS];
    mla_dims_t mla;                  // shared by all MLA layers (published configs use one set)
    int mla_rank_q[ARCH_MAX_LAYERS]; // per-layer ranks (X-EcoMLA layer_rank_list); 0 = mla.r_q
    int mla_rank_kv[ARCH_MAX_LAYERS];
    gdn_dims_t gdn;
    m2_dims_t m2;
    int is_hybrid; // read from / written with hybrid_config.json
} arch_t;

// Sets Llama defaults (theta 10000, eps 1e-5, no scaling, all layers ATTN).
void arch_init(arch_t *a);
// Consistency checks with messages naming the field (src names the file).
int arch_validate(const arch_t *a, const char *src);
// The HyLo recipe's GDN dims for a model of width d (FLA's rule): q/k heads of
// head_k (0 = 256) covering floor(0.75 d) (at least one head), as many value
// heads of 2 head_k, conv 4, the output gate, norm eps 1e-6, no negative
// eigenvalues. The defaults of a hybrid config without gdn_cfg, and of upcycling.
gdn_dims_t arch_gdn_hylo(int d, int head_k);
// MambaInLlama's Mamba-2 dims derived from a teacher's attention: one SSM head
// per attention head (n_heads = H, headdim = d_state = dh, d_inner = H dh), x
// and B at KV width (d_xb = Hkv dh), conv 4, chunk 256, norm eps 1e-5.
m2_dims_t arch_m2_from_attention(const arch_t *t);
// How many of the layers are of kind k.
int arch_count(const arch_t *a, layer_kind_t k);
// Per-layer MLA ranks (falls back to the shared ones).
int arch_mla_rq(const arch_t *a, int layer);
int arch_mla_rkv(const arch_t *a, int layer);

// The buffers of layer l's inference cache for B sequences of cap tokens, in
// bytes, in the order the model lays them out: attention K, V; MLA latent +
// rope key; GDN state, conv q, conv k, conv v; Mamba-2 state, conv [x|B|C].
// Recurrent states take elt_state bytes an element, everything else elt.
// Returns how many buffers (0 for none). The one layout serves the allocation
// and the byte counts below, so what `hylo info` reports is what is allocated.
int arch_cache_parts(const arch_t *a, int l, int64_t B, int64_t cap, int elt_state, int elt, int64_t part[4]);
// Whether layer l's cache grows with the tokens (attention K, V; MLA latent +
// rope key) rather than staying fixed (GDN / Mamba-2 states and conv windows).
int arch_cache_grows(const arch_t *a, int l);
// Cache bytes per token of one sequence (element size `elt` bytes) for the
// growing caches only; fixed-size states reported apart. An inference state
// stores them in its backend's act dtype (model_cache_bytes_per_token).
int64_t arch_cache_bytes_per_token(const arch_t *a, int elt);
// Fixed recurrent state bytes per sequence (GDN / Mamba-2 states + conv states).
int64_t arch_state_bytes(const arch_t *a, int elt_state, int elt_conv);
const char *layer_kind_name(layer_kind_t k);
