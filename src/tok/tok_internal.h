// Shared between the tok/ files only.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

// Pre-tokenizer regexes (formats.md §2.6). The GPT-2 one carries the trailing
// `|\s+` of HF ByteLevel; llama.cpp omits it, which changes nothing (a lone
// unmatched whitespace character becomes its own piece either way).
#define TOK_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define TOK_RE_LLAMA3                                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                                         \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"                                                                     \
    "\\s+(?!\\S)|\\s+"
#define TOK_RE_QWEN2                                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"  \
    "\\s+(?!\\S)|\\s+"
#define TOK_RE_DIGIT "\\p{N}"
#define TOK_RE_DIGITS "\\p{N}+"

// GPT-2 byte <-> unicode code point mapping.
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); // -1 if cp is not the image of a byte

uint64_t tok_hash_bytes(const void *p, size_t n);

// Loader helpers (tok.c). Before tok_build: n_vocab, blob/off/len, type filled;
// merges filled with tok_set_merge; special ids set (-1 when absent); passes set.
int tok_alloc_vocab(tok_t *t, int n_vocab, size_t blob_bytes);
int tok_build_vocab(tok_t *t, const char *src);
int tok_alloc_merges(tok_t *t, int n_merges);
// Merge i = left + right (vocabulary texts); field names it for errors.
int tok_set_merge(tok_t *t, int i, const char *l, size_t ll, const char *r, size_t rl, const char *src,
                  const char *field);
// Builds the merge hash, byte tokens, added-token index, compiles the passes.
int tok_build(tok_t *t, const char *src);
// Sets the pre-tokenizer from a family (GGUF `pre` name or our own).
int tok_set_pre_family(tok_t *t, tok_pre_t p);
int tok_add_pass(tok_t *t, const char *re);

// Chat family recognition (tok_chat.c).
void tok_chat_detect(tok_t *t);

char *tok_strndup(const char *s, size_t n);
