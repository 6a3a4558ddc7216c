// Token shards: the training corpus as `hylo data` writes it and the loader
// (train/data.h) reads it. One file, little-endian, every section 8-byte
// aligned (docs/FORMATS.md, "Token shards"):
//
//   header   64 bytes: magic "HYLOSHRD", version, header size, tokenizer hash
//            (tok_hash), vocabulary size, bytes per token (2 when V <= 65536,
//            else 4), token count, document count, payload CRC-32C, header CRC-32C
//   tokens   n_tokens ids (u16 or u32), zero-padded to 8 bytes
//   mask     n_tokens bits, LSB first: bit i = 1 when token i is a target in
//            the loss; zero-padded to 8 bytes
//   docs     n_docs u64 start offsets: 0, strictly increasing, < n_tokens;
//            document i is [docs[i], docs[i+1]) (the last one ends at n_tokens)
//            and each ends with the EOS id
//
// The file size must be exactly what the header says; a shard is checked
// completely when opened (sizes, CRCs, every id < V, the document index).
#pragma once
#include <stdint.h>

#include "base/fs.h"

#define DATA_SHARD_MAGIC "HYLOSHRD"
#define DATA_SHARD_VERSION 1
#define DATA_SHARD_HEADER_BYTES 64

typedef struct {
    mfile_t mf;
    uint64_t tok_hash;
    int n_vocab;
    int token_bytes; // 2 or 4
    int64_t n_tokens, n_docs;
    const uint8_t *tokens; // n_tokens * token_bytes
    const uint8_t *mask;   // bitmap
    const uint8_t *docs;   // n_docs little-endian u64
} data_shard_t;

// Maps and validates a shard; every problem is ERR_INPUT naming the file and
// the field, with the expected and found values.
int data_shard_open(data_shard_t *s, const char *path);
void data_shard_close(data_shard_t *s);

static inline int32_t data_shard_token(const data_shard_t *s, int64_t i) {
    const uint8_t *p = s->tokens + i * s->token_bytes;
    return s->token_bytes == 2
               ? (int32_t)(p[0] | p[1] << 8)
               : (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}
static inline int data_shard_mask(const data_shard_t *s, int64_t i) { return (s->mask[i >> 3] >> (i & 7)) & 1; }
int64_t data_shard_doc_start(const data_shard_t *s, int64_t i);

// Writer: documents are appended in order, then data_shard_finish writes the
// mask, the index and the header into a temporary file and renames it onto
// path. Ids must be in [0, n_vocab). data_shard_abort removes the temporary.
// Both free the writer.
typedef struct data_shard_writer data_shard_writer_t;
int data_shard_create(data_shard_writer_t **w, const char *path, uint64_t tok_hash, int n_vocab);
// One document of n tokens (n >= 1); mask[i] != 0 puts token i in the loss
// (mask NULL: all of them).
int data_shard_add(data_shard_writer_t *w, const int32_t *ids, const uint8_t *mask, int64_t n);
int64_t data_shard_writer_tokens(const data_shard_writer_t *w);
int64_t data_shard_writer_docs(const data_shard_writer_t *w);
int data_shard_finish(data_shard_writer_t *w);
void data_shard_abort(data_shard_writer_t *w);
