// Flat parameters: every parameter of a model lives in one contiguous buffer;
// this table names the views into it (HF / Zebra-Llama / FLA names, shapes,
// offsets in elements). Checkpoint IO, gradient buffers, AdamW and all-reduce
// all work on the flat buffer through this one table.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/arch.h"

typedef struct {
    char name[96];
    int nd;
    int64_t shape[4]; // PyTorch order, e.g. [out_features, in_features]
    int64_t numel;
    int64_t off;  // element offset in the flat buffer (multiple of 64)
    int layer;    // -1 for embedding / final norm / head
    int no_decay; // norms, A_log, dt_bias, D: no weight decay
} param_t;

typedef struct {
    param_t *p;
    int n, cap;
    int64_t total; // elements in the flat buffer
} ptable_t;

// Builds the table for an architecture (lm_head present iff !tie_embeddings).
int ptable_build(ptable_t *t, const arch_t *a);
void ptable_free(ptable_t *t);
const param_t *ptable_find(const ptable_t *t, const char *name);
// Offset of a named parameter, or -1.
int64_t ptable_off(const ptable_t *t, const char *name);
// Parameter count (sum of numel).
int64_t ptable_count(const ptable_t *t);
// 1 for the parameters that may be kept in a block format (quantised
// inference, model.h MODEL_QUANT; quantised checkpoints, checkpoint.h): the
// matrices only ever multiplied by activations or looked up by row.
int ptable_quantisable(const param_t *p);
// A host fp32 buffer laid out by t (zeroed when zero), for `what` ("the
// teacher's weights"); ERR_NOMEM saying how many bytes and parameters could
// not be allocated for what.
int ptable_alloc_host(const ptable_t *t, const char *what, int zero, float **out);
