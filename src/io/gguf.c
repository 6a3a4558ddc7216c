#include "io/gguf.h"

#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"

// A bounds-checked cursor over the mapping. Every read checks the remaining
// length first, so a truncated or corrupted header is an error, never a crash.
typedef struct {
    const uint8_t *p;
    uint64_t off, size;
    const char *path;
} cur_t;

static int cur_need(cur_t *c, uint64_t n, const char *what) {
    if (n > c->size - c->off)
        return err_set(ERR_INPUT, "%s: truncated GGUF: %s at offset %llu needs %llu bytes, file has %llu", c->path,
                       what, (unsigned long long)c->off, (unsigned long long)n, (unsigned long long)c->size);
    return 0;
}

static int cur_u32(cur_t *c, uint32_t *v, const char *what) {
    TRY(cur_need(c, 4, what));
    memcpy(v, c->p + c->off, 4);
    c->off += 4;
    return 0;
}

static int cur_u64(cur_t *c, uint64_t *v, const char *what) {
    TRY(cur_need(c, 8, what));
    memcpy(v, c->p + c->off, 8);
    c->off += 8;
    return 0;
}

// A GGUF string: u64 length + bytes. Returns a pointer into the mapping.
static int cur_str(cur_t *c, const uint8_t **s, uint64_t *len, const char *what) {
    TRY(cur_u64(c, len, what));
    TRY(cur_need(c, *len, what));
    *s = c->p + c->off;
    c->off += *len;
    return 0;
}

static int vtype_size(uint32_t t) {
    switch (t) {
    case GGUF_UINT8:
    case GGUF_INT8:
    case GGUF_BOOL: return 1;
    case GGUF_UINT16:
    case GGUF_INT16: return 2;
    case GGUF_UINT32:
    case GGUF_INT32:
    case GGUF_FLOAT32: return 4;
    case GGUF_UINT64:
    case GGUF_INT64:
    case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

// Skips one value of type t (used for nested arrays, which we keep but do not index).
static int skip_value(cur_t *c, uint32_t t, int depth, const char *key) {
    if (depth > 4) return err_set(ERR_INPUT, "%s: key %s: arrays nested too deeply", c->path, key);
    int sz = vtype_size(t);
    if (sz) {
        TRY(cur_need(c, (uint64_t)sz, key));
        c->off += (uint64_t)sz;
        return 0;
    }
    if (t == GGUF_STRING) {
        const uint8_t *s;
        uint64_t n;
        return cur_str(c, &s, &n, key);
    }
    if (t == GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        TRY(cur_u32(c, &et, key));
        TRY(cur_u64(c, &n, key));
        int esz = vtype_size(et);
        if (esz) {
            if (n > (c->size - c->off) / (uint64_t)esz) return cur_need(c, UINT64_MAX, key);
            c->off += n * (uint64_t)esz;
            return 0;
        }
        for (uint64_t i = 0; i < n; i++)
            TRY(skip_value(c, et, depth + 1, key));
        return 0;
    }
    return err_set(ERR_INPUT, "%s: key %s: unknown metadata value type %u", c->path, key, t);
}

static int parse_kv(gguf_t *g, cur_t *c, gguf_kv_t *kv) {
    const uint8_t *ks;
    uint64_t klen;
    TRY(cur_str(c, &ks, &klen, "metadata key"));
    if (klen == 0 || klen > 65535)
        return err_set(ERR_INPUT, "%s: metadata key of length %llu at offset %llu", c->path, (unsigned long long)klen,
                       (unsigned long long)c->off);
    kv->key = malloc(klen + 1);
    if (!kv->key) return err_set(ERR_NOMEM, "out of memory");
    memcpy(kv->key, ks, klen);
    kv->key[klen] = 0;
    if (memchr(kv->key, 0, klen)) return err_set(ERR_INPUT, "%s: metadata key contains a NUL byte", c->path);
    TRY(cur_u32(c, &kv->type, kv->key));
    if (kv->type == GGUF_STRING) {
        const uint8_t *s;
        TRY(cur_str(c, &s, &kv->len, kv->key));
        kv->data = s;
        return 0;
    }
    if (kv->type == GGUF_ARRAY) {
        TRY(cur_u32(c, &kv->arr_type, kv->key));
        TRY(cur_u64(c, &kv->arr_n, kv->key));
        kv->data = c->p + c->off;
        int esz = vtype_size(kv->arr_type);
        if (esz) {
            if (kv->arr_n > (c->size - c->off) / (uint64_t)esz)
                return err_set(ERR_INPUT, "%s: key %s: array of %llu elements runs past the end of the file", c->path,
                               kv->key, (unsigned long long)kv->arr_n);
            c->off += kv->arr_n * (uint64_t)esz;
            return 0;
        }
        if (kv->arr_type == GGUF_STRING) {
            // Each string needs at least its 8-byte length, which bounds the count.
            if (kv->arr_n > (c->size - c->off) / 8)
                return err_set(ERR_INPUT, "%s: key %s: string array of %llu elements runs past the end of the file",
                               c->path, kv->key, (unsigned long long)kv->arr_n);
            kv->str_offs = malloc((kv->arr_n + 1) * sizeof(uint64_t));
            if (!kv->str_offs) return err_set(ERR_NOMEM, "out of memory");
            uint64_t base = c->off;
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                kv->str_offs[i] = c->off - base;
                const uint8_t *s;
                uint64_t n;
                TRY(cur_str(c, &s, &n, kv->key));
            }
            return 0;
        }
        for (uint64_t i = 0; i < kv->arr_n; i++)
            TRY(skip_value(c, kv->arr_type, 1, kv->key));
        return 0;
    }
    int sz = vtype_size(kv->type);
    if (!sz) return err_set(ERR_INPUT, "%s: key %s: unknown metadata value type %u", c->path, kv->key, kv->type);
    TRY(cur_need(c, (uint64_t)sz, kv->key));
    kv->data = c->p + c->off;
    c->off += (uint64_t)sz;
    (void)g;
    return 0;
}

static int cmp_kv_key(const void *a, const void *b) {
    return strcmp((*(const gguf_kv_t *const *)a)->key, (*(const gguf_kv_t *const *)b)->key);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const gguf_tensor_t *const *)a)->name, (*(const gguf_tensor_t *const *)b)->name);
}

static int cmp_tensor_off(const void *a, const void *b) {
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a, *y = *(const gguf_tensor_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse(gguf_t *g) {
    cur_t c = {g->mf.data, 0, g->mf.size, g->mf.path};
    uint32_t magic;
    TRY(cur_u32(&c, &magic, "magic"));
    if (magic != 0x46554747u)
        return err_set(ERR_INPUT, "%s: not a GGUF file (magic %08x, expected 'GGUF')", c.path, magic);
    TRY(cur_u32(&c, &g->version, "version"));
    if (g->version == 0x03000000u || g->version == 0x02000000u)
        return err_set(ERR_UNSUP, "%s: big-endian GGUF is not supported", c.path);
    if (g->version == 1) return err_set(ERR_UNSUP, "%s: GGUF version 1 is not supported (only 2 and 3)", c.path);
    if (g->version != 2 && g->version != 3)
        return err_set(ERR_INPUT, "%s: unknown GGUF version %u (expected 2 or 3)", c.path, g->version);
    uint64_t nt, nkv;
    TRY(cur_u64(&c, &nt, "tensor_count"));
    TRY(cur_u64(&c, &nkv, "metadata_kv_count"));
    // Each kv needs at least 12 bytes and each tensor info at least 24: reject
    // counts the file cannot hold before allocating for them.
    if (nkv > c.size / 12 || nt > c.size / 24)
        return err_set(ERR_INPUT, "%s: header claims %llu tensors and %llu metadata keys, more than the file can hold",
                       c.path, (unsigned long long)nt, (unsigned long long)nkv);
    if (nkv > (uint64_t)LIM_ENTRIES || nt > (uint64_t)LIM_ENTRIES)
        return err_set(ERR_INPUT, "%s: header claims %llu tensors and %llu metadata keys (the limit is %lld of each)",
                       c.path, (unsigned long long)nt, (unsigned long long)nkv, (long long)LIM_ENTRIES);
    g->kv = calloc(nkv ? nkv : 1, sizeof *g->kv);
    g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return err_set(ERR_NOMEM, "%s: cannot allocate the tables of %llu metadata keys and %llu tensors", c.path,
                       (unsigned long long)nkv, (unsigned long long)nt);
    for (uint64_t i = 0; i < nkv; i++) {
        g->n_kv = i + 1;
        TRY(parse_kv(g, &c, &g->kv[i]));
    }
    if (!(g->kv_sorted = malloc((nkv ? nkv : 1) * sizeof *g->kv_sorted)))
        return err_set(ERR_NOMEM, "%s: out of memory for the index of %llu metadata keys", c.path,
                       (unsigned long long)nkv);
    for (uint64_t i = 0; i < nkv; i++)
        g->kv_sorted[i] = &g->kv[i];
    qsort(g->kv_sorted, nkv, sizeof *g->kv_sorted, cmp_kv_key);
    for (uint64_t i = 1; i < nkv; i++)
        if (!strcmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key))
            return err_set(ERR_INPUT, "%s: duplicate metadata key %s", c.path, g->kv_sorted[i]->key);
    g->alignment = 32;
    const gguf_kv_t *al = gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_UINT32) return err_set(ERR_INPUT, "%s: general.alignment is not a uint32", c.path);
        memcpy(&g->alignment, al->data, 4);
        if (g->alignment == 0 || (g->alignment & (g->alignment - 1)) || g->alignment % 8)
            return err_set(ERR_INPUT, "%s: general.alignment %u is not a power of two multiple of 8", c.path,
                           g->alignment);
    }
    for (uint64_t i = 0; i < nt; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        g->n_tensors = i + 1;
        const uint8_t *ns;
        uint64_t nlen;
        TRY(cur_str(&c, &ns, &nlen, "tensor name"));
        if (nlen == 0 || nlen > 64)
            return err_set(ERR_INPUT, "%s: tensor %llu: name length %llu (must be 1..64)", c.path,
                           (unsigned long long)i, (unsigned long long)nlen);
        t->name = malloc(nlen + 1);
        if (!t->name) return err_set(ERR_NOMEM, "out of memory");
        memcpy(t->name, ns, nlen);
        t->name[nlen] = 0;
        TRY(cur_u32(&c, &t->n_dims, t->name));
        if (t->n_dims < 1 || t->n_dims > 4)
            return err_set(ERR_INPUT, "%s: tensor %s: %u dimensions (must be 1..4)", c.path, t->name, t->n_dims);
        t->nelem = 1;
        for (int d = 0; d < 4; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t v;
            TRY(cur_u64(&c, &v, t->name));
            if (v == 0 || v > (uint64_t)LIM_NUMEL)
                return err_set(ERR_INPUT, "%s: tensor %s: dimension %u is %llu (must be 1..%lld)", c.path, t->name, d,
                               (unsigned long long)v, (long long)LIM_NUMEL);
            t->ne[d] = (int64_t)v;
            if ((uint64_t)t->nelem > (uint64_t)LIM_NUMEL / v)
                return err_set(ERR_INPUT, "%s: tensor %s: more than %lld elements", c.path, t->name,
                               (long long)LIM_NUMEL);
            t->nelem *= (int64_t)v;
        }
        TRY(cur_u32(&c, &t->type, t->name));
        uint64_t rel;
        TRY(cur_u64(&c, &rel, t->name));
        int blk, bytes;
        if (!ggml_type_block(t->type, &blk, &bytes))
            return err_set(ERR_UNSUP, "%s: tensor %s: unknown ggml type %u", c.path, t->name, t->type);
        if (t->ne[0] % blk)
            return err_set(ERR_INPUT, "%s: tensor %s (%s): row length %lld is not a multiple of the block size %d",
                           c.path, t->name, ggml_type_name(t->type), (long long)t->ne[0], blk);
        t->nbytes = (uint64_t)(t->nelem / blk) * (uint64_t)bytes;
        if (rel % g->alignment)
            return err_set(ERR_INPUT, "%s: tensor %s: offset %llu is not a multiple of the alignment %u", c.path,
                           t->name, (unsigned long long)rel, g->alignment);
        t->offset = rel; // made absolute below
    }
    if (!(g->tensors_sorted = malloc((nt ? nt : 1) * sizeof *g->tensors_sorted)))
        return err_set(ERR_NOMEM, "%s: out of memory for the index of %llu tensors", c.path, (unsigned long long)nt);
    for (uint64_t i = 0; i < nt; i++)
        g->tensors_sorted[i] = &g->tensors[i];
    qsort(g->tensors_sorted, nt, sizeof *g->tensors_sorted, cmp_tensor_name);
    for (uint64_t i = 1; i < nt; i++)
        if (!strcmp(g->tensors_sorted[i - 1]->name, g->tensors_sorted[i]->name))
            return err_set(ERR_INPUT, "%s: duplicate tensor name %s", c.path, g->tensors_sorted[i]->name);
    g->data_start = c.off + (g->alignment - c.off % g->alignment) % g->alignment;
    if (g->data_start > c.size && nt > 0)
        return err_set(ERR_INPUT, "%s: truncated GGUF: tensor data would start at %llu, file has %llu bytes", c.path,
                       (unsigned long long)g->data_start, (unsigned long long)c.size);
    uint64_t room = c.size > g->data_start ? c.size - g->data_start : 0;
    for (uint64_t i = 0; i < nt; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        if (t->offset > room || t->nbytes > room - t->offset)
            return err_set(ERR_INPUT,
                           "%s: tensor %s: data [%llu, %llu) lies past the end of the file (%llu bytes of data)",
                           c.path, t->name, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
                           (unsigned long long)room);
        t->offset += g->data_start;
    }
    // Overlap check: sort by offset and compare neighbours.
    if (nt > 1) {
        gguf_tensor_t **by = malloc(nt * sizeof *by);
        if (!by) return err_set(ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; i < nt; i++)
            by[i] = &g->tensors[i];
        qsort(by, nt, sizeof *by, cmp_tensor_off);
        int rc = 0;
        for (uint64_t i = 1; i < nt && !rc; i++)
            if (by[i - 1]->offset + by[i - 1]->nbytes > by[i]->offset)
                rc = err_set(ERR_INPUT, "%s: tensors %s and %s overlap", c.path, by[i - 1]->name, by[i]->name);
        free(by);
        TRY(rc);
    }
    return 0;
}

int gguf_open(gguf_t *g, const char *path) {
    memset(g, 0, sizeof *g);
    TRY(mfile_open(&g->mf, path));
    int rc = parse(g);
    if (rc < 0) gguf_close(g);
    return rc;
}

void gguf_close(gguf_t *g) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_offs);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_sorted);
    free(g->tensors_sorted);
    mfile_close(&g->mf);
    memset(g, 0, sizeof *g);
    g->mf.fd = -1;
}

const gguf_kv_t *gguf_find(const gguf_t *g, const char *key) {
    if (!g->kv_sorted) return NULL;
    gguf_kv_t probe = {.key = (char *)key};
    const gguf_kv_t *pp = &probe, **hit = bsearch(&pp, g->kv_sorted, g->n_kv, sizeof *hit, cmp_kv_key);
    return hit ? *hit : NULL;
}

static int read_int_value(uint32_t type, const uint8_t *p, int64_t *out) {
    switch (type) {
    case GGUF_UINT8:
    case GGUF_BOOL: *out = *p; return 1;
    case GGUF_INT8: *out = (int8_t)*p; return 1;
    case GGUF_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case GGUF_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case GGUF_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case GGUF_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        *out = (int64_t)v;
        return 1;
    }
    case GGUF_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return 1;
    }
    default: return 0;
    }
}

static const char *vtype_name(uint32_t t) {
    static const char *n[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                              "bool",  "string", "array",  "uint64", "int64",  "float64"};
    return t < 13 ? n[t] : "unknown";
}

static int missing(const gguf_t *g, const char *key) {
    return err_set(ERR_INPUT, "%s: missing metadata key %s", g->mf.path, key);
}

static int wrong(const gguf_t *g, const char *key, const char *want, uint32_t got) {
    return err_set(ERR_INPUT, "%s: metadata key %s is %s, expected %s", g->mf.path, key, vtype_name(got), want);
}

int gguf_get_int(const gguf_t *g, const char *key, int64_t *out) {
    const gguf_kv_t *kv = gguf_find(g, key);
    if (!kv) return missing(g, key);
    if (!read_int_value(kv->type, kv->data, out)) return wrong(g, key, "an integer", kv->type);
    return 0;
}

int gguf_get_float(const gguf_t *g, const char *key, double *out) {
    const gguf_kv_t *kv = gguf_find(g, key);
    if (!kv) return missing(g, key);
    if (kv->type == GGUF_FLOAT32) {
        float f;
        memcpy(&f, kv->data, 4);
        *out = f;
    } else if (kv->type == GGUF_FLOAT64) {
        memcpy(out, kv->data, 8);
    } else {
        return wrong(g, key, "a float", kv->type);
    }
    return 0;
}

int gguf_get_bool(const gguf_t *g, const char *key, int *out) {
    const gguf_kv_t *kv = gguf_find(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != GGUF_BOOL) return wrong(g, key, "bool", kv->type);
    if (*kv->data > 1) return err_set(ERR_INPUT, "%s: metadata key %s: bool value %u", g->mf.path, key, *kv->data);
    *out = *kv->data;
    return 0;
}

int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len) {
    const gguf_kv_t *kv = gguf_find(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != GGUF_STRING) return wrong(g, key, "string", kv->type);
    *s = (const char *)kv->data;
    if (len) *len = kv->len;
    return 0;
}

int gguf_opt_int(const gguf_t *g, const char *key, int64_t *out) {
    return gguf_find(g, key) ? gguf_get_int(g, key, out) : 0;
}
int gguf_opt_float(const gguf_t *g, const char *key, double *out) {
    return gguf_find(g, key) ? gguf_get_float(g, key, out) : 0;
}
int gguf_opt_bool(const gguf_t *g, const char *key, int *out) {
    return gguf_find(g, key) ? gguf_get_bool(g, key, out) : 0;
}

int gguf_get_arr(const gguf_t *g, const char *key, uint32_t elem_type, const gguf_kv_t **out) {
    const gguf_kv_t *kv = gguf_find(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != GGUF_ARRAY) return wrong(g, key, "array", kv->type);
    if (kv->arr_type != elem_type)
        return err_set(ERR_INPUT, "%s: metadata key %s is an array of %s, expected %s", g->mf.path, key,
                       vtype_name(kv->arr_type), vtype_name(elem_type));
    *out = kv;
    return 0;
}

const char *gguf_arr_str(const gguf_kv_t *kv, uint64_t i, size_t *len) {
    const uint8_t *p = kv->data + kv->str_offs[i];
    uint64_t n;
    memcpy(&n, p, 8);
    *len = (size_t)n;
    return (const char *)p + 8;
}

int64_t gguf_arr_int(const gguf_kv_t *kv, uint64_t i) {
    int64_t v = 0;
    read_int_value(kv->arr_type, kv->data + i * (uint64_t)vtype_size(kv->arr_type), &v);
    return v;
}

double gguf_arr_float(const gguf_kv_t *kv, uint64_t i) {
    if (kv->arr_type == GGUF_FLOAT32) {
        float f;
        memcpy(&f, kv->data + 4 * i, 4);
        return f;
    }
    double d;
    memcpy(&d, kv->data + 8 * i, 8);
    return d;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name) {
    if (!g->tensors_sorted) return NULL;
    gguf_tensor_t probe = {.name = (char *)name};
    const gguf_tensor_t *pp = &probe,
                        **hit = bsearch(&pp, g->tensors_sorted, g->n_tensors, sizeof *hit, cmp_tensor_name);
    return hit ? *hit : NULL;
}

int gguf_read_tensor_f32(const gguf_t *g, const gguf_tensor_t *t, float *out) {
    if (!ggml_type_supported(t->type))
        return err_set(ERR_UNSUP, "%s: tensor %s: quantisation type %s is not supported", g->mf.path, t->name,
                       ggml_type_name(t->type));
    const uint8_t *src = g->mf.data + t->offset;
    int blk, bytes;
    ggml_type_block(t->type, &blk, &bytes);
    // Dequantise in row-sized pieces in parallel: rows are independent.
    int64_t rows = t->nelem / t->ne[0];
    uint64_t row_bytes = (uint64_t)(t->ne[0] / blk) * (uint64_t)bytes;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        ggml_dequant(t->type, src + (uint64_t)r * row_bytes, out + r * t->ne[0], t->ne[0]);
    return 0;
}
