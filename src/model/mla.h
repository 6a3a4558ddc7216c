// Multi-head Latent Attention (DeepSeek-V2/V3 as in Zebra-Llama / X-EcoMLA /
// HyLo; spec hybrid_model.md §2-§3). Follows the layer contract of
// model/layer.h.
//
// Dimensions (per layer ranks from arch_mla_rq / arch_mla_rkv):
//   qd = d_nope + d_rope, G = mla.n_kv KV heads of kv_b (query head h reads
//   KV head h / (H / G)).
//   query  x -> q_a [r_q] (-> latent RMSNorm) -> q_b -> [N, H, qd], per head
//          [q_nope (d_nope) | q_pe (d_rope)]; q_proj [H*qd, d] when r_q == 0.
//   kv     x -> kv_a -> [c (r_kv) | k_pe (d_rope)]; c (-> latent RMSNorm) ->
//          kv_b -> [N, G, d_nope + d_v] per KV head [k_nope | value]; k_pe is
//          one rope key shared by all heads.
//   RoPE   ROPE_INTERLEAVED on q_pe and k_pe (YaRN's mscale is in the tables).
//   Qwen3  (a->qk_norm) q_norm over qd per head on q and k_norm over d_rope on
//          k_pe, both before RoPE, eps a->eps. Normalising only k_pe (not the
//          decompressed k_nope) keeps the absorbed decode exact: k_nope stays
//          linear in the cached latent.
//   logits (q_nope . k_nope + RoPE(q_pe) . RoPE(k_pe)) * qd^-1/2 * rope_softmax_mult.
//
// Cache (mla_cache_t): row t of sequence b holds [c_t after the latent norm |
// rotated k_pe_t] (the de-interleaved RoPE layout), r_kv + d_rope values.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/layer.h"
#include "model/params.h"

// Parameter views; NULL when the parameter is absent from this layer. Weights
// are act, the same struct bound to the gradient buffer holds float gradients.
typedef struct {
    void *q_a;       // q_a_proj [r_q, d]              (r_q > 0)
    void *q_a_norm;  // q_a_layernorm [r_q]            (latent_norm)
    void *q_b;       // q_b_proj [H*qd, r_q]           (r_q > 0)
    void *q_proj;    // q_proj [H*qd, d]               (r_q == 0)
    void *kv_a;      // kv_a_proj_with_mqa [r_kv + d_rope, d]
    void *kv_a_norm; // kv_a_layernorm [r_kv]          (latent_norm)
    void *kv_b;      // kv_b_proj [G*(d_nope + d_v), r_kv]
    void *o;         // out_proj [d, H*d_v]
    void *q_norm;    // q_norm [qd]                    (qk_norm)
    void *k_norm;    // k_norm [d_rope]                (qk_norm)
} mla_w_t;

// What mla_backward needs, allocated by mla_forward from ctx->arena (all
// pointers there). N = B*T. Norm inputs are kept so the norms' backward can
// recompute their outputs; fields of absent steps are NULL.
typedef struct {
    int B, T;
    const void *x;   // [N, d] layer input (owned by the caller, kept alive until the backward)
    void *cq;        // [N, r_q] q_a output (before the latent norm)
    void *cqn;       // [N, r_q] input of q_b (= cq without latent norm)
    float *rstd_cq;  // [N]
    void *q_raw;     // [N, H, qd] query before q_norm (qk_norm only)
    float *rstd_q;   // [N*H]
    void *q;         // [N, H, qd] final query (normed, rotated)
    void *c;         // [N, r_kv] latent before the latent norm
    void *cn;        // [N, r_kv] input of kv_b (= c without latent norm)
    float *rstd_c;   // [N]
    void *kpe_raw;   // [N, d_rope] rope key before k_norm (qk_norm only)
    float *rstd_kpe; // [N]
    void *k;         // [N, G, qd] keys as attended (k_nope | rotated k_pe)
    void *v;         // [N, G, d_v]
    void *att;       // [N, H, d_v] attention output (input of out_proj)
    float *lse;      // [B, H, T]
    int32_t *pos;    // [N] positions
} mla_saved_t;

// Binds w to the parameters of MLA layer `layer` in a flat buffer whose
// element size is elt_size (act for weights, 4 for float gradients):
// w->X = flat + off * elt_size. Returns ERR_INPUT when a parameter the layer
// cannot do without is missing.
int mla_w_bind(mla_w_t *w, const ptable_t *pt, void *flat, size_t elt_size, int layer);

// Decompressed path (training, prefill): x [B, T, d] -> out [B, T, d] for
// positions pos0 .. pos0+T-1. With a cache, rows [pos0, pos0+T) of every
// sequence are written and the attention runs over all rows 0 .. pos0+T
// (rows before pos0 must hold earlier tokens: chunked prefill). sv non-NULL
// (training) requires cache == NULL. Returns 0 or a negative ERR_* code.
int mla_forward(const layer_ctx_t *c, const mla_w_t *w, void *out, const void *x, int B, int T, int pos0,
                layer_cache_t *cache, mla_saved_t *sv);
// Inference over the rows of runs (layer.h step_run_t), each with a cache:
// a batched prefill's requests, each with its own T and position.
int mla_forward_runs(const layer_ctx_t *c, const mla_w_t *w, void *out, const void *x, int n_runs,
                     const step_run_t *runs);

// dout [B, T, d] -> dx [B, T, d] (overwritten); g (float) += weight gradients.
int mla_backward(const layer_ctx_t *c, const mla_w_t *w, mla_w_t *g, void *dx, const void *dout, const mla_saved_t *sv);

// One token per sequence of the runs (layer.h step_run_t), x [N, d] -> out
// [N, d], each at its cache's position len: appends its cache row and attends
// over rows 0 .. len with the absorbed weights (spec §3.3). Does not advance
// cache->len (the visible lengths len + 1 come from ctx_step_positions).
int mla_step(const layer_ctx_t *c, const mla_w_t *w, const lin_out_t *out, const void *x, const void *xw, int n_runs,
             const step_run_t *runs);
// Whether mla_step can take its input unnormed with the gain xw (q_a and
// kv_a one matrix in memory, no latent or q / k norms: one product,
// be->proj_rmsnorm); else x is normed already and xw NULL.
int mla_step_norms_input(const layer_ctx_t *c, const mla_w_t *w);
