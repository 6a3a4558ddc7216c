// Upcycling: the student's parameters from the teacher's. Every attention
// layer becomes MLA (truncated SVD of Q and of the joint K/V, X-EcoMLA /
// Zebra-Llama), Gated DeltaNet (GQA expansion + truncation, HyLo) or Mamba-2
// (MambaInLlama mapping); MLPs, norms, embedding, final norm and head are
// copied verbatim; the parts no rule covers are drawn from a seeded generator
// with the reference libraries' default initialisations.
// All buffers are host fp32 flat buffers laid out by their ptable.
#pragma once
#include <stdint.h>

#include "model/arch.h"
#include "model/params.h"

// Recipe defaults for the student's block dimensions given a teacher
// (hylo_recipe.md §1; docs/CONVERT.md states the rules). kind_linear is
// LAYER_GDN or LAYER_M2; mla_layers / n_mla the MLA layer plan.
typedef struct {
    int r_q, r_kv, d_rope, d_nope, d_v; // MLA; 0 = recipe default
    int gdn_heads, gdn_head_dim;        // GDN; 0 = recipe default
    float yarn_factor;                  // MLA RoPE YaRN factor (<= 1: plain RoPE)
    int yarn_orig;                      // original_max_position_embeddings for YaRN
} upc_dims_t;

// The student's layer kinds for a teacher of n_layers layers: MLA at the
// listed layers, each a layer of the teacher and listed once (ERR_INPUT
// naming the index otherwise), kind_linear at the others. The one check of a
// layer plan, for the upcycling and the stage-1 assembly alike.
int upc_plan(int n_layers, const int *mla_layers, int n_mla, layer_kind_t kind_linear, layer_kind_t *kind);

// Fills `student` from `teacher`: the layer kinds (upc_plan) and every block
// dimension.
int upc_student_arch(const arch_t *teacher, const int *mla_layers, int n_mla, layer_kind_t kind_linear,
                     const upc_dims_t *dims, arch_t *student);

// Converts teacher weights tw (laid out by tpt) into student weights sw
// (laid out by spt), layer by layer. seed drives every random initialisation.
int upc_convert(const arch_t *teacher, const ptable_t *tpt, const float *tw, const arch_t *student, const ptable_t *spt,
                float *sw, uint64_t seed);

// One MLA layer from one attention layer (exposed for tests).
int upc_mla_from_attention(const arch_t *t, const ptable_t *tpt, const float *tw, const arch_t *s, const ptable_t *spt,
                           float *sw, int layer);

// Truncated SVD of a row-major [m, n] matrix: U [m, r], S [r], Vt [r, n] (the
// r largest singular values). Returns the singular values of every rank into
// s_all (min(m, n) values) when non-NULL.
int upc_svd(const float *A, int m, int n, int r, float *U, float *S, float *Vt, float *s_all);
