// tok_hash: a fingerprint of what decides the ids a text encodes to, so that a
// token shard can be checked against the tokenizer a trainer loads. It covers
// the vocabulary (every token's text and type), the merges in rank order, the
// ids the data pipeline inserts (bos, eos, unk) with the add_bos / add_eos /
// unk_model / ignore_merges switches, and the pre-tokenizer regex passes. Not
// covered: pad, eot, eom and the chat template (they change no encoding).
// A GGUF and the Hugging Face files `hylo export` writes from it hash the same.
//
// 64-bit FNV-1a over a canonical byte stream: integers as 8 little-endian
// bytes, strings as their length then their bytes, so the value is the same on
// every machine and no two different tokenizers serialise to the same stream.
#include <string.h>

#include "tok/tok_internal.h"

typedef struct {
    uint64_t h;
} fnv_t;

static void fnv_bytes(fnv_t *f, const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = f->h;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    f->h = h;
}

static void fnv_int(fnv_t *f, int64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    fnv_bytes(f, b, 8);
}

static void fnv_str(fnv_t *f, const char *s, size_t n) {
    fnv_int(f, (int64_t)n);
    fnv_bytes(f, s, n);
}

uint64_t tok_hash(const tok_t *t) {
    fnv_t f = {0xcbf29ce484222325ull};
    fnv_str(&f, "hylo tokenizer v1", 17);
    fnv_int(&f, t->n_vocab);
    for (int i = 0; i < t->n_vocab; i++) {
        fnv_int(&f, t->type[i]);
        fnv_str(&f, t->blob + t->off[i], t->len[i]);
    }
    fnv_int(&f, t->n_merges);
    for (int i = 0; i < t->n_merges; i++) {
        fnv_int(&f, t->merge_l[i]);
        fnv_int(&f, t->merge_r[i]);
    }
    const int64_t sw[] = {t->bos, t->eos, t->unk, t->add_bos, t->add_eos, t->unk_model, t->ignore_merges};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        fnv_int(&f, sw[i]);
    fnv_int(&f, t->n_pass);
    for (int i = 0; i < t->n_pass; i++)
        fnv_str(&f, t->pass_src[i], strlen(t->pass_src[i]));
    return f.h;
}
