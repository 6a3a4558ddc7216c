// RoPE frequencies (default, llama3, linear, YaRN) and the cos/sin tables the
// backend's rope op reads: float [n_pos, dr/2], with the attention scaling
// (YaRN's mscale) folded in, so q.k of the rotated parts carries mscale^2.
#pragma once
#include "model/arch.h"

// inv_freq[dr/2]; *mscale = factor folded into cos/sin (1 unless YaRN).
void rope_inv_freq(const rope_cfg_t *r, int dr, float *inv_freq, float *mscale);
// Host tables: angle = fp32(t) * inv_freq (fp32), cos = mscale * cos(angle).
void rope_tables(const rope_cfg_t *r, int dr, int n_pos, float *cos_out, float *sin_out);
// Multiplier of the softmax scale (DeepSeek's mscale_all_dim: mscale(F, all)^2; else 1).
float rope_softmax_mult(const rope_cfg_t *r);
