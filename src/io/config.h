// Hugging Face config files <-> arch_t.
//
//  config.json          LlamaForCausalLM / Qwen3ForCausalLM (formats.md 3.3):
//                       the teacher (or the hybrid's base model).
//  hybrid_config.json   Zebra-Llama's HybridConfig (hybrid_model.md 1.3) plus
//                       our GDN extension: "linear_type": "gdn" | "mamba",
//                       "gdn_cfg": {num_heads, num_v_heads, head_dim, expand_v,
//                       conv_size, use_gate, norm_eps, allow_neg_eigval},
//                       optional "attn_layers" (layers kept as attention) and
//                       X-EcoMLA's "layer_rank_list" (per-layer MLA ranks).
//  generation_config.json  bos / eos ids.
//
// Readers start from arch_init (config.json) or from an arch already filled by
// config.json (hybrid_config.json), and finish with arch_validate. Messages name
// the file and the field. Writers are atomic (temporary + rename).
//
// eos ids: a->eos_id is the first end-of-sequence id and a->eos_ids[0..n_eos)
// holds all of them (eos_ids[0] == eos_id): config.json's, then the others
// generation_config.json lists. The config writers give them back, and
// generation stops on them beside the tokenizer's end ids (gen_stop_ids).
#pragma once
#include "model/arch.h"

// config.json. Unknown architectures are ERR_UNSUP naming `architectures`,
// wrong types ERR_INPUT naming the field. `src` names the text in messages.
int cfg_parse_config_json(const char *text, const char *src, arch_t *a);
int cfg_read_config_json(const char *path, arch_t *a);

// hybrid_config.json on top of an arch filled from config.json: layer kinds
// (mla_layers -> MLA, attn_layers -> attention, all others GDN or Mamba-2 by
// linear_type, default Mamba-2 as in Zebra-Llama), MLA dims and YaRN rope,
// Mamba-2 dims (read only when the plan has Mamba-2 layers), GDN dims (only
// when it has GDN layers). Sets a->is_hybrid.
int cfg_parse_hybrid_config(const char *text, const char *src, arch_t *a);
int cfg_read_hybrid_config(const char *path, arch_t *a);

// generation_config.json: adds its eos ids to a->eos_ids (config.json's first),
// and takes its bos id when config.json had none.
int cfg_parse_generation_config(const char *text, const char *src, arch_t *a);

// <dir>/config.json, then hybrid_config.json and generation_config.json when present.
int cfg_load_dir(const char *dir, arch_t *a);

// config.json as transformers writes it (sorted keys, indent 2): architectures,
// model_type, torch_dtype bfloat16, every field the reader uses, rope_scaling in
// its original form.
int cfg_write_config_json(const arch_t *a, const char *path);
// hybrid_config.json: Zebra's keys in the dataclass order (indent 4), then
// linear_type, gdn_cfg (when GDN layers exist), attn_layers (when any) and
// layer_rank_list (when per-layer ranks are set). rope_scaling is
// {"factor", "original_max_position_embeddings", "rope_type": "yarn"} (plus
// beta / mscale keys only when they differ from the defaults) or null.
int cfg_write_hybrid_config(const arch_t *a, const char *path);
// generation_config.json: bos_token_id, eos_token_id (a list when several), pad_token_id.
int cfg_write_generation_config(const arch_t *a, const char *path);
