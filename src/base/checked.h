// Sizes read from files: the limit of each kind of field, and checked 64-bit
// arithmetic on them. Every reader (GGUF, safetensors, config.json,
// hybrid_config.json, recipes, tokenizer files) holds what it reads to these
// limits before anything is sized or allocated from it, and arch_validate
// holds every dimension and product of an architecture to them, so the int
// arithmetic of the parameter table, the layers and the upcycler cannot
// overflow. A value past its limit is ERR_INPUT naming the file, the field,
// the value and the limit.
#pragma once
#include <stdint.h>

// One dimension of a model: a width, head dim, head count, rank, state size,
// FFN size (the largest published ones are near 2^16).
#define LIM_DIM ((int64_t)1 << 20)
// A product of two dimensions that is one side of a weight matrix or a cache
// row (H x dh, n_kv x (d_nope + d_v), GDN heads x head dim). Two of them and a
// small factor still fit an int.
#define LIM_WIDTH ((int64_t)1 << 24)
// Tokens of a vocabulary (the tokenizer's ids are int32; the largest
// published vocabularies hold about 2^18).
#define LIM_VOCAB ((int64_t)1 << 24)
// A context length or a position count (max_position_embeddings, YaRN's
// original window, a GGUF context_length).
#define LIM_POS ((int64_t)1 << 30)
// Elements of one tensor, and of a recurrent state per sequence.
#define LIM_NUMEL ((int64_t)1 << 40)
// Elements of a whole model's flat parameter buffer.
#define LIM_PARAMS ((int64_t)1 << 42)
// Entries of one table in a file: GGUF tensors and metadata keys, BPE merges,
// added tokens, list items of a recipe.
#define LIM_ENTRIES ((int64_t)1 << 24)
// Bytes of a text file read whole (JSON, YAML, a chat template).
#define LIM_TEXT_BYTES ((int64_t)1 << 30)
// Floating-point fields: every one must be finite; these bound the ones that
// scale positions or frequencies (a RoPE base, a scaling factor).
#define LIM_ROPE_THETA 1e12
#define LIM_ROPE_FACTOR 65536.0

// 0 when lo <= v <= hi, else ERR_INPUT "SRC: FIELD = V is out of range [LO, HI]".
int ck_int(const char *src, const char *field, int64_t v, int64_t lo, int64_t hi);
// *out = a x b (a, b >= 0) when that is at most limit, else ERR_INPUT
// "SRC: FIELD = A x B exceeds the limit of LIMIT" (no overflow on the way).
int ck_mul(const char *src, const char *field, int64_t a, int64_t b, int64_t limit, int64_t *out);
// *out = a + b (a, b >= 0) when that is at most limit, else ERR_INPUT as ck_mul.
int ck_add(const char *src, const char *field, int64_t a, int64_t b, int64_t limit, int64_t *out);
// 0 when v is finite and lo <= v <= hi, else ERR_INPUT "SRC: FIELD = V is out of range [LO, HI]"
// (or "is not finite").
int ck_real(const char *src, const char *field, double v, double lo, double hi);
// 0 when v is finite, v > 0 and v <= hi, else ERR_INPUT "SRC: FIELD = V must be in (0, HI]".
int ck_positive(const char *src, const char *field, double v, double hi);
