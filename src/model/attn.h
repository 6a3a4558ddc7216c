// The teacher's attention layer (Llama / Qwen3): GQA, RoPE (NEOX pairs),
// optional Qwen3 q/k RMSNorm per head, KV cache for inference.
#pragma once
#include "model/layer.h"
#include "model/params.h"

typedef struct {
    void *q, *k, *v, *o;   // q_proj [H*dh, d], k_proj/v_proj [Hkv*dh, d], o_proj [d, H*dh]
    void *q_norm, *k_norm; // [dh], Qwen3 only (NULL otherwise)
} attn_w_t;

typedef struct {
    const void *x;          // layer input [N, d] (owned by the caller, kept alive)
    void *q_raw, *k_raw;    // projections before q/k norm (Qwen3 only)
    float *q_rstd, *k_rstd; // [N*H], [N*Hkv] (Qwen3 only)
    void *q, *k, *v;        // after norm and RoPE: [N, H, dh], [N, Hkv, dh], [N, Hkv, dh]
    void *att;              // attention output [N, H, dh]
    float *lse;             // [B, H, T]
    int32_t *pos;           // [N]
    int B, T;
} attn_saved_t;

int attn_w_bind(attn_w_t *w, const ptable_t *pt, void *flat, size_t elt, int layer);
int attn_forward(const layer_ctx_t *c, const attn_w_t *w, void *out, const void *x, int B, int T, int pos0,
                 layer_cache_t *cache, attn_saved_t *sv);
// Inference over the rows of runs (layer.h step_run_t), each with a cache:
// a batched prefill's requests, each with its own T and position.
int attn_forward_runs(const layer_ctx_t *c, const attn_w_t *w, void *out, const void *x, int n_runs,
                      const step_run_t *runs);
int attn_backward(const layer_ctx_t *c, const attn_w_t *w, attn_w_t *g, void *dx, const void *dout,
                  const attn_saved_t *sv);
// One token per sequence of the runs (layer.h step_run_t), x [N,d] -> out
// [N,d], each at its cache's position len: appends its K and V rows (not len).
// x normed already (xw NULL), or the residual stream with its norm's gain xw,
// applied by the q/k/v product (only where attn_step_norms_input says so).
int attn_step(const layer_ctx_t *c, const attn_w_t *w, const lin_out_t *out, const void *x, const void *xw, int n_runs,
              const step_run_t *runs);
// Whether attn_step over N rows can take its input unnormed with the gain
// (its q, k and v one fused product: be->proj_rope_kv_append).
int attn_step_norms_input(const layer_ctx_t *c, const attn_w_t *w, int N);
