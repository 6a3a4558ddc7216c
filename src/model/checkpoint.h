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

// Writes the folder `dir` from host fp32 weights laid out by pt, in dtype
// (ST_F32, ST_BF16 or ST_F16). The folder appears complete or not at all: the
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
