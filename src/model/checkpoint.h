// Checkpoint folders in the Hugging Face / Zebra-Llama / HyLo layout:
// config.json (the base model's), hybrid_config.json (hybrids),
// generation_config.json, model.safetensors (our parameter names, which are the
// published ones), tokenizer.json + tokenizer_config.json (+ chat template) +
// special_tokens_map.json. Reading goes through io/weights (wsrc_open on the folder).
#pragma once
#include "base/fs.h"
#include "model/arch.h"
#include "model/params.h"
#include "tok/tok.h"

// dtype CKPT_QUANT + a ggml type (GGML_Q8_0, GGML_Q4_0, GGML_Q4_1): the
// matrices ptable_quantisable allows (and whose rows are a multiple of 32)
// are stored in that block format, as U8 tensors [rows, bytes per row], with
// __metadata__ WSRC_QUANT_KEY (io/weights.h) naming the format; the other matrices bf16, 1-D
// parameters fp32. io/weights reads such a folder (dequantised, or kept as
// blocks by a MODEL_QUANT load).
enum { CKPT_QUANT = 1024 };

// Writes the folder `dir` from host fp32 weights laid out by pt, in dtype
// (ST_F32, ST_BF16 or ST_F16, or CKPT_QUANT + type above). The folder appears complete or not at all: the
// files are written into "<dir>.hylo-tmp.<pid>" and that is renamed onto dir,
// which must not exist or be empty (base/fs.h outdir_t: a trailing slash is
// dropped; temporaries of killed runs are removed). meta: extra safetensors
// __metadata__ pairs (key, value, ..., NULL) or NULL. tok may be NULL (no
// tokenizer files); one with more tokens than the model's vocabulary is
// refused (the folder would not load).
int ckpt_write(const char *dir, const arch_t *a, const ptable_t *pt, const float *host, int dtype, const tok_t *tok,
               const char *const *meta);
// The same, with extra(tmp, user) writing more files into the temporary folder
// before it is renamed (the trainer's optimizer and trainer state), so the
// checkpoint appears whole or not at all.
int ckpt_write_with(const char *dir, const arch_t *a, const ptable_t *pt, const float *host, int dtype,
                    const tok_t *tok, const char *const *meta, int (*extra)(const char *tmp, void *user), void *user);
// For a command with work to do before it writes: ckpt_check (the arch is
// valid, the tokenizer fits it) and fs_outdir_begin before the work, then
// ckpt_write_out writes into the folder begun and commits it (or removes it,
// on an error).
int ckpt_check(const char *dir, const arch_t *a, const tok_t *tok);
int ckpt_write_out(outdir_t *o, const arch_t *a, const ptable_t *pt, const float *host, int dtype, const tok_t *tok,
                   const char *const *meta);
