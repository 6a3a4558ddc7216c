// libFuzzer target for the safetensors reader: the input is a whole file, parsed
// from memory by st_open_mem (the same parser st_open uses on a mapping), then
// every tensor is looked up by name and converted to fp32, and the metadata read.
// Build: make fuzz; run: see docs/FUZZING.md.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        log_set_level(LOG_QUIET);
        quiet = 1;
    }
    st_file_t f;
    if (st_open_mem(&f, data, size, "fuzz.safetensors") < 0) return 0;
    for (int64_t i = 0; i < f.n_tensors; i++) {
        const st_tensor_t *t = &f.tensors[i];
        // The index must find every tensor, and its bytes must lie inside the input.
        if (st_find(&f, t->name) != t) abort();
        if (t->data < data + f.data_start || t->data + t->nbytes > data + size) abort();
        // numel <= 2 * nbytes (4-bit dtypes), and nbytes <= size: the allocation is bounded.
        float *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *out);
        if (!out) abort();
        if (st_read_f32(&f, t, out) == 0) {
            volatile float sink = 0;
            for (int64_t k = 0; k < t->numel; k++)
                sink += out[k]; // touch every converted value
            (void)sink;
        }
        free(out);
    }
    for (int i = 0; i < f.n_meta; i++)
        if (st_meta(&f, f.meta_key[i]) != f.meta_val[i] && strcmp(st_meta(&f, f.meta_key[i]), f.meta_val[i])) abort();
    st_close(&f);
    return 0;
}
