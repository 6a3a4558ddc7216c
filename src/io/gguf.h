// GGUF v2/v3 reader (little-endian). The file is memory-mapped; metadata and
// tensor infos are parsed and validated up front (sizes, offsets, alignment,
// block divisibility, overlap), tensor data is dequantised on request.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/fs.h"

enum gguf_vtype {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
};

// ggml tensor types as stored in files.
enum ggml_type {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q8_1 = 9,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_Q8_K = 15,
    GGML_I8 = 24,
    GGML_I16 = 25,
    GGML_I32 = 26,
    GGML_I64 = 27,
    GGML_F64 = 28,
    GGML_BF16 = 30,
};

typedef struct {
    char *key;
    uint32_t type;       // enum gguf_vtype
    uint32_t arr_type;   // element type when type == GGUF_ARRAY
    uint64_t arr_n;      // element count when type == GGUF_ARRAY
    const uint8_t *data; // value bytes in the mapping (array: first element)
    uint64_t len;        // string length (GGUF_STRING)
    uint64_t *str_offs;  // string arrays: offset of each element's length field from data
} gguf_kv_t;

typedef struct {
    char *name;
    uint32_t n_dims;
    int64_t ne[4];   // ggml order: ne[0] is the contiguous (fastest) dimension
    uint32_t type;   // enum ggml_type
    uint64_t offset; // absolute offset in the file
    uint64_t nbytes;
    int64_t nelem;
} gguf_tensor_t;

typedef struct {
    mfile_t mf;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start;
    gguf_kv_t *kv;
    uint64_t n_kv;
    gguf_tensor_t *tensors;
    uint64_t n_tensors;
    // Sorted by key / name: duplicates are found and lookups made in
    // O(n log n) / O(log n), whatever the counts (a file of 200K tensors used
    // to take minutes in pairwise name comparisons).
    const gguf_kv_t **kv_sorted;
    const gguf_tensor_t **tensors_sorted;
} gguf_t;

int gguf_open(gguf_t *g, const char *path);
void gguf_close(gguf_t *g);

const gguf_kv_t *gguf_find(const gguf_t *g, const char *key);
// Typed getters. A missing key or a wrong type is ERR_INPUT naming the file and key.
// Integer getters accept any integer or bool type; float getters accept f32/f64.
int gguf_get_int(const gguf_t *g, const char *key, int64_t *out);
int gguf_get_float(const gguf_t *g, const char *key, double *out);
int gguf_get_bool(const gguf_t *g, const char *key, int *out);
int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len);
// Same, but leave *out unchanged and return 0 when the key is absent.
int gguf_opt_int(const gguf_t *g, const char *key, int64_t *out);
int gguf_opt_float(const gguf_t *g, const char *key, double *out);
int gguf_opt_bool(const gguf_t *g, const char *key, int *out);

// Arrays: the kv must be an array of the given element type.
int gguf_get_arr(const gguf_t *g, const char *key, uint32_t elem_type, const gguf_kv_t **out);
const char *gguf_arr_str(const gguf_kv_t *kv, uint64_t i, size_t *len);
int64_t gguf_arr_int(const gguf_kv_t *kv, uint64_t i); // integer element types
double gguf_arr_float(const gguf_kv_t *kv, uint64_t i);

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name);
// Dequantises a whole tensor into out (nelem floats), in ggml order (row-major
// with ne[0] fastest, i.e. PyTorch [ne[n-1], ..., ne[0]]).
int gguf_read_tensor_f32(const gguf_t *g, const gguf_tensor_t *t, float *out);

const char *ggml_type_name(uint32_t type);
// Block size (elements) and bytes per block; 0 for unknown types.
int ggml_type_block(uint32_t type, int *blk, int *bytes);
int ggml_type_supported(uint32_t type); // dequantisation implemented
// Dequantises n elements (a multiple of the block size) of one type.
void ggml_dequant(uint32_t type, const void *src, float *dst, int64_t n);
// Quantises n floats (a multiple of 32) into blocks of Q8_0, Q4_0 or Q4_1
// (each element within half a quantisation step of the block's scale); 0 for
// other types.
int ggml_quantize(uint32_t type, const float *src, void *dst, int64_t n);
// "Q8_0" / "q8_0" ... -> the type, -1 when unknown.
int ggml_type_from_name(const char *name);
