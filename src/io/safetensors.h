// safetensors: reader (memory-mapped, header fully validated up front), model
// folders (one file, an index of shards, or every *.safetensors), and a
// streaming writer (fp32 host data -> F32 / F16 / BF16). Layout in
// ../shared/spec/formats.md section 3.1: u64 little-endian header length N,
// N bytes of JSON, then the byte buffer the tensors' data_offsets index.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/fs.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000ull // the reference reader's limit

// Every dtype of the format, so a valid file always opens; only the float ones
// convert to fp32 (st_read_f32).
typedef enum {
    ST_BOOL,
    ST_F4, // sub-byte dtypes: bits per element below
    ST_F6_E2M3,
    ST_F6_E3M2,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_F8_E8M0,
    ST_F8_E4M3FNUZ,
    ST_F8_E5M2FNUZ,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_C64,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_N_DTYPES
} st_dtype_t;

const char *st_dtype_name(int dtype);
int st_dtype_bits(int dtype);             // bits per element
int st_dtype_from_name(const char *name); // -1 when unknown

typedef struct {
    char *name;
    int dtype; // st_dtype_t
    int ndim;  // 0 = scalar
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; // data_offsets, relative to the byte buffer
    const uint8_t *data; // begin's address in the mapping
    uint64_t nbytes;     // end - begin
} st_tensor_t;

typedef struct {
    char path[1024];
    mfile_t mf;         // unused (fd -1) when opened from memory
    const uint8_t *buf; // whole file
    uint64_t size;
    uint64_t data_start;  // 8 + header length
    st_tensor_t *tensors; // in header order
    int64_t n_tensors;
    const st_tensor_t **by_name; // sorted by name, for st_find
    char **meta_key, **meta_val; // __metadata__, in header order
    int n_meta;
} st_file_t;

// Opens and validates a file. On error nothing stays open and the message
// names the file (and the tensor when one is at fault).
int st_open(st_file_t *f, const char *path);
// Same over a caller-owned buffer (kept alive until st_close); `name` is used
// in messages. The fuzz target and st_open share this parser.
int st_open_mem(st_file_t *f, const void *data, size_t size, const char *name);
void st_close(st_file_t *f);

const st_tensor_t *st_find(const st_file_t *f, const char *name);
const char *st_meta(const st_file_t *f, const char *key); // NULL when absent

// Converts F32 / F16 / BF16 / F64 data to fp32 (t->numel floats into out);
// any other dtype is ERR_UNSUP naming the tensor.
int st_read_f32(const st_file_t *f, const st_tensor_t *t, float *out);

// ---- a model folder -------------------------------------------------------
// Opens <dir>/model.safetensors; else the shards named by
// <dir>/model.safetensors.index.json (every listed file must exist and hold the
// tensors the weight_map assigns to it); else every *.safetensors in <dir>
// (sorted by name). A tensor name found in two files is an error.
typedef struct {
    const st_tensor_t *t;
    int file; // index into st_set_t.files
} st_entry_t;

typedef struct {
    char dir[1024];
    st_file_t *files;
    int n_files;
    st_entry_t *index; // every tensor of every file, sorted by name
    int64_t n_index;
} st_set_t;

int st_set_open(st_set_t *s, const char *dir);
void st_set_close(st_set_t *s);
// Looks a tensor up across the files; *file (optional) receives its file.
const st_tensor_t *st_set_find(const st_set_t *s, const char *name, const st_file_t **file);
// st_read_f32 by name; a missing tensor is ERR_INPUT naming the folder and tensor.
int st_set_read_f32(const st_set_t *s, const char *name, float *out);

// ---- writer ---------------------------------------------------------------
// Collects tensors (pointers to caller-owned fp32 host data, kept alive until
// st_writer_write returns) and writes them in one pass: tensors sorted as the
// reference writer does (dtype descending in the format's dtype order, i.e.
// F32 before BF16 before F16, then by name), header space-padded to a multiple
// of 8, each tensor converted and streamed in pieces (no second copy of the
// model), the file appearing under its name only when complete.
typedef struct {
    char *name;
    int dtype; // ST_F32, ST_F16 or ST_BF16; ST_U8 for raw bytes
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const float *data;
    const uint8_t *raw; // ST_U8: the bytes, written as they are
} st_wtensor_t;

typedef struct {
    st_wtensor_t *t;
    int n, cap;
} st_writer_t;

void st_writer_init(st_writer_t *w);
// Rejects (ERR_INPUT, naming the tensor) empty or duplicate names,
// "__metadata__", other dtypes, negative dims and more than ST_MAX_DIMS dims.
int st_writer_add(st_writer_t *w, const char *name, int dtype, int ndim, const int64_t *shape, const float *data);
// A U8 tensor of raw bytes (numel of shape bytes at raw, caller-owned): blocks
// of a quantised matrix, which the format has no dtype for.
int st_writer_add_raw(st_writer_t *w, const char *name, int ndim, const int64_t *shape, const uint8_t *raw);
// meta: NULL, or key, value, key, value, ..., NULL (strings) for __metadata__.
int st_writer_write(const st_writer_t *w, const char *path, const char *const *meta);
void st_writer_free(st_writer_t *w);
