// libFuzzer target for the GGUF reader: the input is written to an in-memory
// file (memfd) and opened by path with gguf_open, exactly as a file on disk;
// then every metadata value is read through the typed getters (every element
// of every array) and every tensor with a dequantiser is decoded to fp32.
// Build: make fuzz; run: see docs/FUZZING.md.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_metadata(const gguf_t *g) {
    volatile double sink = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv_t *kv = &g->kv[i];
        int64_t v;
        double f;
        int b;
        const char *s;
        size_t len;
        if (gguf_get_int(g, kv->key, &v) == 0) sink += (double)v;
        if (gguf_get_float(g, kv->key, &f) == 0) sink += f;
        if (gguf_get_bool(g, kv->key, &b) == 0) sink += b;
        if (gguf_get_str(g, kv->key, &s, &len) == 0 && len) sink += s[len - 1];
        if (kv->type != GGUF_ARRAY) continue;
        const gguf_kv_t *arr;
        if (gguf_get_arr(g, kv->key, kv->arr_type, &arr) != 0) abort();
        for (uint64_t k = 0; k < arr->arr_n; k++) {
            switch (arr->arr_type) {
            case GGUF_STRING:
                s = gguf_arr_str(arr, k, &len);
                if (len) sink += s[len - 1];
                break;
            case GGUF_FLOAT32:
            case GGUF_FLOAT64: sink += gguf_arr_float(arr, k); break;
            case GGUF_ARRAY: k = arr->arr_n; break; // nested arrays are kept, not indexed
            default: sink += (double)gguf_arr_int(arr, k); break;
            }
        }
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        log_set_level(LOG_QUIET);
        fd = memfd_create("fuzz.gguf", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) abort();
    if (size && pwrite(fd, data, size, 0) != (ssize_t)size) abort();

    gguf_t g;
    if (gguf_open(&g, path) < 0) return 0;
    read_metadata(&g);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor_t *t = &g.tensors[i];
        if (gguf_find_tensor(&g, t->name) != t) abort();
        if (t->offset < g.data_start || t->offset + t->nbytes > g.mf.size) abort();
        if (!ggml_type_supported(t->type)) continue;
        // nbytes <= size bounds nelem (at most 256 elements per 84-byte block).
        float *out = malloc((size_t)t->nelem * sizeof *out);
        if (!out) abort();
        if (gguf_read_tensor_f32(&g, t, out) != 0) abort(); // a supported type must decode
        volatile float sink = 0;
        for (int64_t k = 0; k < t->nelem; k++)
            sink += out[k];
        (void)sink;
        free(out);
    }
    gguf_close(&g);
    return 0;
}
