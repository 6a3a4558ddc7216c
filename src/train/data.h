// The shard loader the trainer reads: fixed-length rows of the packed token
// stream, shuffled per epoch, split across ranks, resumable exactly.
//
// Token shards (train/shard.h, docs/FORMATS.md): a versioned binary file made
// by `hylo data` (header with magic, version, tokenizer hash, vocabulary size,
// token dtype (u16 when V <= 65536 else u32), token count, document count; the
// tokens; a per-token loss-mask bitmap; the document index (start offsets)). One
// shard file per output; a corpus may be several shards (a folder or a list).
//
// Packing as the published runs do it (hybrid_model.md §8): documents are
// concatenated with EOS between them and cut into rows across document
// boundaries; positions run 0..T-1 over a row, nothing is reset at a boundary.
#pragma once
#include <stdint.h>

#include "tok/tok.h"

typedef struct data_loader data_loader_t;
typedef struct {
    int64_t epoch, index;
} data_pos_t; // where the loader is: row `index` (of this rank's rows) of epoch `epoch` comes next

// Opens a shard file or a folder of *.shard files (taken in name order). tok
// may be NULL (no check); else a shard whose tokenizer hash or vocabulary size
// differs is refused with an error naming the file and both hashes. Rows are
// windows of T+1 consecutive tokens of the concatenated stream (non-overlapping
// targets: stride T), the last partial window dropped (a log line gives the
// count). rank/world: this rank takes a disjoint slice of the rows (position j
// of the epoch's shuffled order belongs to rank j % world); every rank takes
// the same number, floor(rows / world), so the last rows % world positions of
// each epoch's order are left out (a log line says so when there are any). Per
// epoch the row order is a permutation drawn from (seed, epoch) (deterministic:
// same seed -> same order on any machine). Fewer than T+1 tokens, or fewer
// rows than ranks, is an error.
int data_loader_open(data_loader_t **out, const char *path, const tok_t *tok, int T, uint64_t seed, int rank,
                     int world);
// A mixture: each source a shard file or folder with a fraction w > 0 (the
// dataset_mixer of a recipe); source s gives round(w R_s) of its R_s rows to
// every epoch (w < 1: a subset fixed for the run; w > 1: repeats), rows never
// cross sources, and the epoch's order shuffles all shares together. One
// source of fraction 1 is data_loader_open.
typedef struct {
    const char *path;
    double weight;
} data_source_t;
int data_loader_open_mix(data_loader_t **out, const data_source_t *srcs, int n_src, const tok_t *tok, int T,
                         uint64_t seed, int rank, int world);
// The same over an explicit list of shard files (their stream order).
int data_loader_open_list(data_loader_t **out, const char *const *paths, int n_paths, const tok_t *tok, int T,
                          uint64_t seed, int rank, int world);
int64_t data_loader_rows(const data_loader_t *dl);   // rows of this rank per epoch
int64_t data_loader_tokens(const data_loader_t *dl); // tokens in all shards
// The next row: ids [T] = window[0..T), targets [T] = window[1..T], where a
// target whose loss-mask bit is 0 is -1 (ignored by the CE loss). After the
// last row of an epoch the next epoch begins (epoch + 1, new order).
int data_loader_next(data_loader_t *dl, int32_t *ids, int32_t *targets);
data_pos_t data_loader_pos(const data_loader_t *dl);
// Exact resume: the rows after seek(p) are the rows that came after pos() == p.
// p.index in [0, rows), p.epoch >= 0; else ERR_INPUT.
int data_loader_seek(data_loader_t *dl, data_pos_t p);
void data_loader_close(data_loader_t *dl);

// The global row (0 .. total rows - 1, row r = tokens [r T, r T + T]) that
// position j of epoch `epoch`'s order holds: what data_loader_next reads for
// this rank's row i is data_loader_row_at(dl, epoch, i * world + rank).
int64_t data_loader_row_at(const data_loader_t *dl, int64_t epoch, int64_t j);
// Reads global row r into ids/targets as data_loader_next does (no state change).
int data_loader_read_row(const data_loader_t *dl, int64_t r, int32_t *ids, int32_t *targets);
