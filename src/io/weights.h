// A source of model weights by Hugging Face name, in HF layout and fp32, from
// either a GGUF file (names mapped, llama Q/K rows un-permuted, dequantised)
// or a Hugging Face / hybrid checkpoint folder (safetensors). Also fills the
// architecture from the same source.
#pragma once
#include <stdint.h>

#include "io/gguf.h"
#include "model/arch.h"

typedef struct wsrc wsrc_t;

// Checkpoint folders with matrices in a ggml block format (model/checkpoint.h
// CKPT_QUANT) name it under this safetensors __metadata__ key ("Q8_0", ...);
// such a matrix is a U8 tensor [rows, bytes per row].
#define WSRC_QUANT_KEY "hylo.quant"

// path: a .gguf file or a folder with config.json (+ hybrid_config.json).
int wsrc_open(wsrc_t **out, const char *path, arch_t *arch);
void wsrc_close(wsrc_t *s);
// 1 if the source holds the tensor.
int wsrc_has(const wsrc_t *s, const char *name);
// Reads tensor `name`, checking it has exactly `shape` (nd dims, PyTorch order).
int wsrc_read(wsrc_t *s, const char *name, const int64_t *shape, int nd, float *out);
// Weights kept as stored (quantised inference): 1 when tensor `name` is a
// matrix of exactly `shape` (nd == 2) in a block format the CPU products take
// (GGUF: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, BF16; checkpoint folders: BF16 and
// the WSRC_QUANT_KEY format), with
// its ggml type and the bytes of one row; 0 otherwise (then wsrc_read it).
int wsrc_raw_info(const wsrc_t *s, const char *name, const int64_t *shape, int nd, uint32_t *type, size_t *row_bytes);
// Copies rows [row0, row0 + nrows) of such a tensor as stored (row_bytes
// each) into out and gives the file's pages of them back (mfile_release: the
// caller keeps the copy, the process need not hold the file too). Llama q/k
// rows are un-permuted as wsrc_read does: those tensors (wsrc_raw_permuted)
// are read whole.
int wsrc_read_raw(wsrc_t *s, const char *name, const int64_t *shape, int nd, int64_t row0, int64_t nrows, void *out);
int wsrc_raw_permuted(const wsrc_t *s, const char *name);
// Folders: every tensor of the folder must be one of `known` (our parameter
// names); an unknown one is ERR_INPUT naming it, or a warning when allow.
int wsrc_check_unknown(const wsrc_t *s, const char *const *known, int n_known, int allow);
// Dtype summary of the source's tensors, e.g. "Q4_1: 210, Q8_0: 1, F32: 61".
void wsrc_dtype_summary(const wsrc_t *s, char *buf, size_t cap);
// The GGUF file behind the source (NULL for a folder): the tokenizer reads its metadata.
const gguf_t *wsrc_gguf(const wsrc_t *s);
const char *wsrc_path(const wsrc_t *s);

// GGUF metadata -> arch (general.architecture llama or qwen3).
int gguf_arch(const gguf_t *g, arch_t *a);
// The GGUF tensor name for an HF name ("model.layers.3.self_attn.q_proj.weight"
// -> "blk.3.attn_q.weight"); 0 on success, ERR_INPUT when there is none.
int gguf_name_for(const char *hf_name, char *out, size_t cap);
