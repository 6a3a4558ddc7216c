#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/half.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "base/utf8.h"

// Tensor data is little-endian; we read and write it with memcpy.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

// ---- dtypes -----------------------------------------------------------------

// In the format's enum order: the writer's sort depends on it.
static const struct {
    const char *name;
    int bits;
} dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 8},
    [ST_F4] = {"F4", 4},
    [ST_F6_E2M3] = {"F6_E2M3", 6},
    [ST_F6_E3M2] = {"F6_E3M2", 6},
    [ST_U8] = {"U8", 8},
    [ST_I8] = {"I8", 8},
    [ST_F8_E5M2] = {"F8_E5M2", 8},
    [ST_F8_E4M3] = {"F8_E4M3", 8},
    [ST_F8_E8M0] = {"F8_E8M0", 8},
    [ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [ST_I16] = {"I16", 16},
    [ST_U16] = {"U16", 16},
    [ST_F16] = {"F16", 16},
    [ST_BF16] = {"BF16", 16},
    [ST_I32] = {"I32", 32},
    [ST_U32] = {"U32", 32},
    [ST_F32] = {"F32", 32},
    [ST_C64] = {"C64", 64},
    [ST_F64] = {"F64", 64},
    [ST_I64] = {"I64", 64},
    [ST_U64] = {"U64", 64},
};

const char *st_dtype_name(int dtype) { return dtype >= 0 && dtype < ST_N_DTYPES ? dtypes[dtype].name : "?"; }
int st_dtype_bits(int dtype) { return dtype >= 0 && dtype < ST_N_DTYPES ? dtypes[dtype].bits : 0; }

int st_dtype_from_name(const char *name) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(dtypes[i].name, name)) return i;
    return -1;
}

// ---- reader -----------------------------------------------------------------

static const char *json_type_name(const cJSON *j) {
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

// A JSON number that is a non-negative integer exactly representable in a
// double (offsets and dims of any real file are far below 2^53).
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > 9007199254740992.0 || v != floor(v)) return 0;
    *out = (uint64_t)v;
    return 1;
}

static int cmp_tensor_name(const void *a, const void *b) {
    const st_tensor_t *x = *(const st_tensor_t *const *)a, *y = *(const st_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_tensor_offsets(const void *a, const void *b) {
    const st_tensor_t *x = *(const st_tensor_t *const *)a, *y = *(const st_tensor_t *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// Formats a shape as "[2, 3]" for messages.
static const char *shape_str(const st_tensor_t *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int parse_metadata(st_file_t *f, const cJSON *m) {
    if (cJSON_IsNull(m)) return 0;
    if (!cJSON_IsObject(m))
        return err_set(ERR_INPUT, "%s: __metadata__: expected an object of strings, found %s", f->path,
                       json_type_name(m));
    int n = cJSON_GetArraySize(m);
    f->meta_key = calloc((size_t)n + 1, sizeof(char *));
    f->meta_val = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_key || !f->meta_val) return err_set(ERR_NOMEM, "%s: out of memory", f->path);
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        if (!cJSON_IsString(e))
            return err_set(ERR_INPUT, "%s: __metadata__: key %s: expected a string, found %s", f->path, e->string,
                           json_type_name(e));
        f->meta_key[f->n_meta] = strdup(e->string);
        f->meta_val[f->n_meta] = strdup(e->valuestring);
        if (!f->meta_key[f->n_meta] || !f->meta_val[f->n_meta]) return err_set(ERR_NOMEM, "%s: out of memory", f->path);
        f->n_meta++;
    }
    // Duplicates among the keys sorted (n log n for a header of any size).
    char **k = malloc((size_t)(n ? n : 1) * sizeof *k);
    if (!k) return err_set(ERR_NOMEM, "%s: out of memory checking %d __metadata__ keys", f->path, n);
    memcpy(k, f->meta_key, (size_t)f->n_meta * sizeof *k);
    qsort(k, (size_t)f->n_meta, sizeof *k, cmp_str);
    int rc = 0;
    for (int i = 1; i < f->n_meta && rc == 0; i++)
        if (!strcmp(k[i - 1], k[i])) rc = err_set(ERR_INPUT, "%s: __metadata__: duplicate key %s", f->path, k[i]);
    free(k);
    return rc;
}

// One tensor entry: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}.
static int parse_tensor(st_file_t *f, const cJSON *j, st_tensor_t *t, uint64_t buf_size) {
    const char *p = f->path, *nm = t->name;
    if (!cJSON_IsObject(j))
        return err_set(ERR_INPUT, "%s: tensor %s: expected an object, found %s", p, nm, json_type_name(j));
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!dt || !sh || !of)
        return err_set(ERR_INPUT, "%s: tensor %s: missing %s", p, nm, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!cJSON_IsString(dt))
        return err_set(ERR_INPUT, "%s: tensor %s: dtype: expected a string, found %s", p, nm, json_type_name(dt));
    t->dtype = st_dtype_from_name(dt->valuestring);
    if (t->dtype < 0) return err_set(ERR_INPUT, "%s: tensor %s: unknown dtype \"%s\"", p, nm, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return err_set(ERR_INPUT, "%s: tensor %s: shape: expected an array, found %s", p, nm, json_type_name(sh));
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return err_set(ERR_UNSUP, "%s: tensor %s: %d dimensions (at most %d supported)", p, nm, nd, ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, sh) {
        uint64_t v;
        if (!json_u64(e, &v))
            return err_set(ERR_INPUT, "%s: tensor %s: shape[%d]: expected a non-negative integer", p, nm, k);
        if (__builtin_mul_overflow(numel, v, &numel) || numel > (uint64_t)LIM_NUMEL)
            return err_set(ERR_INPUT, "%s: tensor %s: shape[%d] = %llu: more than %lld elements", p, nm, k,
                           (unsigned long long)v, (long long)LIM_NUMEL);
        t->shape[k++] = (int64_t)v;
    }
    t->numel = (int64_t)numel;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return err_set(ERR_INPUT, "%s: tensor %s: data_offsets: expected an array of 2 integers", p, nm);
    if (!json_u64(of->child, &t->begin) || !json_u64(of->child->next, &t->end))
        return err_set(ERR_INPUT, "%s: tensor %s: data_offsets: expected non-negative integers", p, nm);
    if (t->end < t->begin)
        return err_set(ERR_INPUT, "%s: tensor %s: data_offsets [%llu, %llu) end before they begin", p, nm,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > buf_size)
        return err_set(ERR_INPUT, "%s: tensor %s: data_offsets [%llu, %llu) lie past the end of the %llu-byte buffer",
                       p, nm, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)buf_size);
    t->nbytes = t->end - t->begin;
    uint64_t bits = numel * (uint64_t)st_dtype_bits(t->dtype); // numel <= LIM_NUMEL, bits <= 64: no overflow
    char sbuf[256];
    if (bits % 8)
        return err_set(ERR_INPUT, "%s: tensor %s: shape %s of %s is not a whole number of bytes", p, nm,
                       shape_str(t, sbuf, sizeof sbuf), st_dtype_name(t->dtype));
    if (bits / 8 != t->nbytes)
        return err_set(ERR_INPUT,
                       "%s: tensor %s: shape %s of %s needs %llu bytes, but data_offsets [%llu, %llu) hold %llu", p, nm,
                       shape_str(t, sbuf, sizeof sbuf), st_dtype_name(t->dtype), (unsigned long long)(bits / 8),
                       (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)t->nbytes);
    t->data = f->buf + f->data_start + t->begin;
    return 0;
}

// The whole header: length prefix, JSON, every tensor, and the buffer layout
// (sorted by offsets, each tensor must start where the previous one ended and
// the last must end at the end of the file: no holes, no overlap).
static int parse(st_file_t *f) {
    const char *p = f->path;
    if (f->size < 8)
        return err_set(ERR_INPUT, "%s: file of %llu bytes is too short for the 8-byte header length", p,
                       (unsigned long long)f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | f->buf[i];
    if (n > ST_MAX_HEADER)
        return err_set(ERR_INPUT, "%s: header length %llu exceeds the limit of %llu bytes", p, (unsigned long long)n,
                       (unsigned long long)ST_MAX_HEADER);
    if (n > f->size - 8)
        return err_set(ERR_INPUT, "%s: header length %llu runs past the end of the file (%llu bytes)", p,
                       (unsigned long long)n, (unsigned long long)f->size);
    f->data_start = 8 + n;
    const uint8_t *h = f->buf + 8;
    if (n < 2 || h[0] != '{') return err_set(ERR_INPUT, "%s: header is not a JSON object (does not start with '{')", p);
    size_t bad = utf8_check(h, (size_t)n);
    if (bad != n)
        return err_set(ERR_INPUT, "%s: header is not valid UTF-8 (byte %llu of the header)", p,
                       (unsigned long long)bad);
    if (memchr(h, 0, (size_t)n)) return err_set(ERR_INPUT, "%s: header contains a NUL byte", p);

    // cJSON needs a terminated string; the mapping is not one.
    char *text = malloc((size_t)n + 1);
    if (!text) return err_set(ERR_NOMEM, "%s: out of memory for a %llu-byte header", p, (unsigned long long)n);
    memcpy(text, h, (size_t)n);
    text[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 0);
    int rc = 0;
    if (!root) {
        long at = end ? (long)(end - text) : -1;
        rc = err_set(ERR_INPUT, "%s: header is not valid JSON (error near byte %ld of the header)", p, at);
        goto done;
    }
    // Only JSON whitespace (the writer pads with spaces) may follow the object.
    for (const char *q = end; *q; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            rc = err_set(ERR_INPUT, "%s: header has trailing bytes after the JSON object (byte %ld)", p,
                         (long)(q - text));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        rc = err_set(ERR_INPUT, "%s: header is not a JSON object", p);
        goto done;
    }

    int64_t nt = 0, nmeta = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__"))
            nmeta++;
        else
            nt++;
    }
    if (nmeta > 1) {
        rc = err_set(ERR_INPUT, "%s: header has %lld __metadata__ entries", p, (long long)nmeta);
        goto done;
    }
    f->tensors = calloc((size_t)(nt ? nt : 1), sizeof *f->tensors);
    f->by_name = calloc((size_t)(nt ? nt : 1), sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        rc = err_set(ERR_NOMEM, "%s: out of memory for %lld tensors", p, (long long)nt);
        goto done;
    }
    uint64_t buf_size = f->size - f->data_start;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) {
            if ((rc = parse_metadata(f, e)) < 0) goto done;
            continue;
        }
        st_tensor_t *t = &f->tensors[f->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) {
            rc = err_set(ERR_NOMEM, "%s: out of memory", p);
            goto done;
        }
        f->by_name[f->n_tensors] = t;
        f->n_tensors++;
        if ((rc = parse_tensor(f, e, t, buf_size)) < 0) goto done;
    }

    qsort(f->by_name, (size_t)nt, sizeof *f->by_name, cmp_tensor_name);
    for (int64_t i = 1; i < nt; i++)
        if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name)) {
            rc = err_set(ERR_INPUT, "%s: duplicate tensor name %s", p, f->by_name[i]->name);
            goto done;
        }

    // Layout: walk the tensors in offset order.
    const st_tensor_t **by_off = malloc((size_t)(nt ? nt : 1) * sizeof *by_off);
    if (!by_off) {
        rc = err_set(ERR_NOMEM, "%s: out of memory", p);
        goto done;
    }
    for (int64_t i = 0; i < nt; i++)
        by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)nt, sizeof *by_off, cmp_tensor_offsets);
    uint64_t pos = 0;
    const char *prev = NULL;
    for (int64_t i = 0; i < nt && rc == 0; i++) {
        const st_tensor_t *t = by_off[i];
        if (t->begin < pos)
            rc = err_set(ERR_INPUT, "%s: tensor %s: data_offsets [%llu, %llu) overlap tensor %s (which ends at %llu)",
                         p, t->name, (unsigned long long)t->begin, (unsigned long long)t->end, prev,
                         (unsigned long long)pos);
        else if (t->begin > pos)
            rc = err_set(ERR_INPUT,
                         "%s: tensor %s: hole in the buffer: bytes [%llu, %llu) before it belong to no tensor", p,
                         t->name, (unsigned long long)pos, (unsigned long long)t->begin);
        pos = t->end;
        prev = t->name;
    }
    if (rc == 0 && pos != buf_size) {
        if (prev)
            rc = err_set(ERR_INPUT, "%s: hole in the buffer: bytes [%llu, %llu) after tensor %s belong to no tensor", p,
                         (unsigned long long)pos, (unsigned long long)buf_size, prev);
        else
            rc =
                err_set(ERR_INPUT, "%s: hole in the buffer: its %llu bytes belong to no tensor (the header lists none)",
                        p, (unsigned long long)buf_size);
    }
    free(by_off);
done:
    cJSON_Delete(root);
    free(text);
    return rc;
}

int st_open_mem(st_file_t *f, const void *data, size_t size, const char *name) {
    memset(f, 0, sizeof *f);
    f->mf.fd = -1;
    snprintf(f->path, sizeof f->path, "%s", name);
    f->buf = data;
    f->size = size;
    int rc = parse(f);
    if (rc < 0) st_close(f);
    return rc;
}

int st_open(st_file_t *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->mf.fd = -1;
    mfile_t mf;
    TRY(mfile_open(&mf, path));
    static const uint8_t empty[1] = {0};
    int rc = st_open_mem(f, mf.data ? mf.data : empty, mf.size, path);
    if (rc < 0) {
        mfile_close(&mf);
        return rc;
    }
    f->mf = mf;
    return 0;
}

void st_close(st_file_t *f) {
    for (int64_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->tensors);
    free(f->by_name);
    free(f->meta_key);
    free(f->meta_val);
    if (f->mf.fd >= 0) mfile_close(&f->mf);
    memset(f, 0, sizeof *f);
    f->mf.fd = -1;
}

const st_tensor_t *st_find(const st_file_t *f, const char *name) {
    int64_t lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

const char *st_meta(const st_file_t *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_key[i], key)) return f->meta_val[i];
    return NULL;
}

// Conversions run in pieces of this many elements, in parallel.
#define ST_PIECE ((int64_t)1 << 16)

int st_read_f32(const st_file_t *f, const st_tensor_t *t, float *out) {
    const uint8_t *src = t->data;
    int64_t n = t->numel;
    // The data may sit at any byte offset, so every element is read with memcpy.
    switch (t->dtype) {
    case ST_F32: memcpy(out, src, (size_t)n * 4); return 0;
    case ST_F16:
    case ST_BF16:
#pragma omp parallel for schedule(static) if (n > ST_PIECE)
        for (int64_t i = 0; i < n; i += ST_PIECE) {
            int64_t m = n - i < ST_PIECE ? n - i : ST_PIECE;
            if (t->dtype == ST_F16)
                f16_row_to_f32(src + 2 * i, out + i, m);
            else
                bf16_row_to_f32(src + 2 * i, out + i, m);
        }
        return 0;
    case ST_F64:
#pragma omp parallel for schedule(static) if (n > ST_PIECE)
        for (int64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, src + 8 * i, 8);
            out[i] = (float)v;
        }
        return 0;
    default:
        return err_set(ERR_UNSUP, "%s: tensor %s: dtype %s cannot be converted to fp32 (F32, F16, BF16, F64 can)",
                       f->path, t->name, st_dtype_name(t->dtype));
    }
}

// ---- model folders ------------------------------------------------------------

static int cmp_entry(const void *a, const void *b) {
    const st_entry_t *x = a, *y = b;
    return strcmp(x->t->name, y->t->name);
}

static void free_strs(char **v, int n) {
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

// Opens the listed files (plain names inside s->dir) into s->files.
static int open_files(st_set_t *s, char **names, int n) {
    s->files = calloc((size_t)(n ? n : 1), sizeof *s->files);
    if (!s->files) return err_set(ERR_NOMEM, "%s: out of memory", s->dir);
    for (int i = 0; i < n; i++) {
        char path[1024];
        TRY(fs_join(path, sizeof path, s->dir, names[i]));
        TRY(st_open(&s->files[i], path));
        s->n_files = i + 1;
    }
    return 0;
}

// Merges every file's tensors into one sorted index; a name in two files is an error.
static int build_index(st_set_t *s) {
    int64_t n = 0;
    for (int i = 0; i < s->n_files; i++)
        n += s->files[i].n_tensors;
    s->index = malloc((size_t)(n ? n : 1) * sizeof *s->index);
    if (!s->index) return err_set(ERR_NOMEM, "%s: out of memory", s->dir);
    for (int i = 0; i < s->n_files; i++)
        for (int64_t k = 0; k < s->files[i].n_tensors; k++)
            s->index[s->n_index++] = (st_entry_t){&s->files[i].tensors[k], i};
    qsort(s->index, (size_t)n, sizeof *s->index, cmp_entry);
    for (int64_t k = 1; k < n; k++)
        if (!strcmp(s->index[k - 1].t->name, s->index[k].t->name))
            return err_set(ERR_INPUT, "%s: tensor %s is in both %s and %s", s->dir, s->index[k].t->name,
                           s->files[s->index[k - 1].file].path, s->files[s->index[k].file].path);
    return 0;
}

// A weight_map value must name a file inside the folder.
static int plain_file_name(const char *s) { return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, ".."); }

typedef struct {
    const char *tensor, *file;
} wm_entry_t;

static int cmp_wm(const void *a, const void *b) {
    return strcmp(((const wm_entry_t *)a)->tensor, ((const wm_entry_t *)b)->tensor);
}

static int open_index(st_set_t *s, const char *ipath) {
    char *text = NULL;
    TRY(fs_read_all(ipath, &text, NULL));
    int rc = 0;
    char **files = NULL;
    int nf = 0;
    wm_entry_t *wm = NULL;
    cJSON *root = cJSON_Parse(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!root || !cJSON_IsObject(root)) {
        rc = err_set(ERR_INPUT, "%s: not a JSON object", ipath);
        goto done;
    }
    if (!cJSON_IsObject(map)) {
        rc = err_set(ERR_INPUT, "%s: weight_map: expected an object, found %s", ipath,
                     map ? json_type_name(map) : "nothing");
        goto done;
    }
    int n = cJSON_GetArraySize(map);
    wm = calloc((size_t)(n ? n : 1), sizeof *wm);
    files = calloc((size_t)(n ? n : 1), sizeof *files);
    if (!wm || !files) {
        rc = err_set(ERR_NOMEM, "%s: out of memory", ipath);
        goto done;
    }
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e)) {
            rc = err_set(ERR_INPUT, "%s: weight_map: tensor %s: expected a file name, found %s", ipath, e->string,
                         json_type_name(e));
            goto done;
        }
        if (!plain_file_name(e->valuestring)) {
            rc = err_set(ERR_INPUT, "%s: weight_map: tensor %s: \"%s\" is not a file name inside the folder", ipath,
                         e->string, e->valuestring);
            goto done;
        }
        wm[k++] = (wm_entry_t){e->string, e->valuestring};
        int seen = 0;
        for (int i = 0; i < nf && !seen; i++)
            seen = !strcmp(files[i], e->valuestring);
        if (!seen) {
            char path[1024];
            if ((rc = fs_join(path, sizeof path, s->dir, e->valuestring)) < 0) goto done;
            if (!fs_exists(path)) {
                rc = err_set(ERR_INPUT, "%s: weight_map: tensor %s: shard %s does not exist", ipath, e->string, path);
                goto done;
            }
            if (!(files[nf] = strdup(e->valuestring))) {
                rc = err_set(ERR_NOMEM, "%s: out of memory", ipath);
                goto done;
            }
            nf++;
        }
    }
    qsort(wm, (size_t)n, sizeof *wm, cmp_wm);
    for (int i = 1; i < n; i++)
        if (!strcmp(wm[i - 1].tensor, wm[i].tensor)) {
            rc = err_set(ERR_INPUT, "%s: weight_map lists tensor %s twice", ipath, wm[i].tensor);
            goto done;
        }
    qsort(files, (size_t)nf, sizeof *files, cmp_str);
    if ((rc = open_files(s, files, nf)) < 0) goto done;
    // Each listed tensor must be in the shard the map names.
    for (int i = 0; i < n; i++) {
        int fi = 0;
        while (fi < nf && strcmp(files[fi], wm[i].file))
            fi++;
        if (!st_find(&s->files[fi], wm[i].tensor)) {
            rc = err_set(ERR_INPUT, "%s: weight_map: tensor %s: not found in its shard %s", ipath, wm[i].tensor,
                         s->files[fi].path);
            goto done;
        }
    }
    if ((rc = build_index(s)) < 0) goto done;
    // Tensors the map does not list are still loaded (as transformers does), with a warning.
    for (int64_t i = 0; i < s->n_index; i++) {
        wm_entry_t key = {s->index[i].t->name, NULL};
        if (!bsearch(&key, wm, (size_t)n, sizeof *wm, cmp_wm))
            log_warn("%s: tensor %s in %s is not listed in the weight_map", ipath, key.tensor,
                     s->files[s->index[i].file].path);
    }
done:
    free_strs(files, nf);
    free(wm);
    cJSON_Delete(root);
    free(text);
    return rc;
}

static int open_all(st_set_t *s) {
    DIR *d = opendir(s->dir);
    if (!d) return err_set(ERR_IO, "%s: cannot open folder: %s", s->dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
        char path[1024];
        if (fs_join(path, sizeof path, s->dir, de->d_name) < 0 || fs_is_dir(path)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) {
                rc = err_set(ERR_NOMEM, "%s: out of memory", s->dir);
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = err_set(ERR_NOMEM, "%s: out of memory", s->dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == 0 && n == 0)
        rc = err_set(ERR_INPUT, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", s->dir);
    if (rc == 0) {
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        rc = open_files(s, names, n);
    }
    if (rc == 0) rc = build_index(s);
    free_strs(names, n);
    return rc;
}

int st_set_open(st_set_t *s, const char *dir) {
    memset(s, 0, sizeof *s);
    if (strlen(dir) >= sizeof s->dir - 64) return err_set(ERR_INPUT, "%s: folder path too long", dir);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    if (!fs_is_dir(dir)) return err_set(ERR_IO, "%s: not a folder", dir);
    char one[1024], idx[1024];
    TRY(fs_join(one, sizeof one, dir, "model.safetensors"));
    TRY(fs_join(idx, sizeof idx, dir, "model.safetensors.index.json"));
    int rc;
    if (fs_exists(one)) {
        char *names[1] = {"model.safetensors"};
        rc = open_files(s, names, 1);
        if (rc == 0) rc = build_index(s);
    } else if (fs_exists(idx)) {
        rc = open_index(s, idx);
    } else {
        rc = open_all(s);
    }
    if (rc < 0) st_set_close(s);
    return rc;
}

void st_set_close(st_set_t *s) {
    for (int i = 0; i < s->n_files; i++)
        st_close(&s->files[i]);
    free(s->files);
    free(s->index);
    memset(s, 0, sizeof *s);
}

const st_tensor_t *st_set_find(const st_set_t *s, const char *name, const st_file_t **file) {
    int64_t lo = 0, hi = s->n_index - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->index[mid].t->name, name);
        if (c == 0) {
            if (file) *file = &s->files[s->index[mid].file];
            return s->index[mid].t;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int st_set_read_f32(const st_set_t *s, const char *name, float *out) {
    const st_file_t *f;
    const st_tensor_t *t = st_set_find(s, name, &f);
    if (!t) return err_set(ERR_INPUT, "%s: tensor %s: not found in any safetensors file", s->dir, name);
    return st_read_f32(f, t, out);
}

// ---- writer -------------------------------------------------------------------

void st_writer_init(st_writer_t *w) { memset(w, 0, sizeof *w); }

void st_writer_free(st_writer_t *w) {
    for (int i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    memset(w, 0, sizeof *w);
}

int st_writer_add_raw(st_writer_t *w, const char *name, int ndim, const int64_t *shape, const uint8_t *raw) {
    // added as an F32 tensor of no data, for the checks, then made U8
    int64_t zero[ST_MAX_DIMS] = {0};
    TRY(st_writer_add(w, name, ST_F32, ndim, ndim > 0 && ndim <= ST_MAX_DIMS ? zero : shape, NULL));
    st_wtensor_t *t = &w->t[w->n - 1];
    t->dtype = ST_U8;
    t->numel = 1;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i], t->numel *= shape[i];
    t->raw = raw;
    if (t->numel > 0 && !raw) {
        free(t->name), w->n--;
        return err_set(ERR_INPUT, "safetensors writer: tensor %s: no data", name);
    }
    return 0;
}

int st_writer_add(st_writer_t *w, const char *name, int dtype, int ndim, const int64_t *shape, const float *data) {
    if (!name || !name[0]) return err_set(ERR_INPUT, "safetensors writer: empty tensor name");
    if (!strcmp(name, "__metadata__")) return err_set(ERR_INPUT, "safetensors writer: tensor %s: reserved name", name);
    if (utf8_check((const uint8_t *)name, strlen(name)) != strlen(name))
        return err_set(ERR_INPUT, "safetensors writer: tensor %s: name is not valid UTF-8", name);
    if (dtype != ST_F32 && dtype != ST_F16 && dtype != ST_BF16)
        return err_set(ERR_INPUT, "safetensors writer: tensor %s: dtype %s (expected F32, F16 or BF16)", name,
                       st_dtype_name(dtype));
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return err_set(ERR_INPUT, "safetensors writer: tensor %s: %d dimensions (expected 0..%d)", name, ndim,
                       ST_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return err_set(ERR_INPUT, "safetensors writer: tensor %s: dimension %d is %lld", name, i,
                           (long long)shape[i]);
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > ((uint64_t)1 << 60))
            return err_set(ERR_INPUT, "safetensors writer: tensor %s: too many elements", name);
    }
    if (numel > 0 && !data) return err_set(ERR_INPUT, "safetensors writer: tensor %s: no data", name);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name)) return err_set(ERR_INPUT, "safetensors writer: duplicate tensor %s", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        st_wtensor_t *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return err_set(ERR_NOMEM, "safetensors writer: out of memory");
        w->t = t;
        w->cap = cap;
    }
    st_wtensor_t *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return err_set(ERR_NOMEM, "safetensors writer: out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = (int64_t)numel;
    t->data = data;
    w->n++;
    return 0;
}

static void sb_fmt_u64(strbuf_t *b, uint64_t v) {
    char t[32];
    int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    strbuf_putn(b, t, (size_t)n);
}

static uint64_t wbytes(const st_wtensor_t *t) {
    return (uint64_t)t->numel * (t->dtype == ST_F32 ? 4 : t->dtype == ST_U8 ? 1 : 2);
}

static int cmp_wtensor(const void *a, const void *b) {
    const st_wtensor_t *x = *(const st_wtensor_t *const *)a, *y = *(const st_wtensor_t *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

// Converts and writes one tensor in pieces of `chunk` elements.
static int write_tensor(afile_t *af, const st_wtensor_t *t, uint16_t *tmp, int64_t chunk) {
    if (t->dtype == ST_F32) return fs_write(af, t->data, (size_t)t->numel * 4);
    if (t->dtype == ST_U8) return fs_write(af, t->raw, (size_t)t->numel);
    for (int64_t i0 = 0; i0 < t->numel; i0 += chunk) {
        int64_t n = t->numel - i0 < chunk ? t->numel - i0 : chunk;
        const float *x = t->data + i0;
#pragma omp parallel for schedule(static) if (n > ST_PIECE)
        for (int64_t i = 0; i < n; i += ST_PIECE) {
            int64_t m = n - i < ST_PIECE ? n - i : ST_PIECE;
            if (t->dtype == ST_BF16)
                f32_row_to_bf16(x + i, tmp + i, m);
            else
                f32_row_to_f16(x + i, tmp + i, m);
        }
        TRY(fs_write(af, tmp, (size_t)n * 2));
    }
    return 0;
}

int st_writer_write(const st_writer_t *w, const char *path, const char *const *meta) {
    int n = w->n;
    const st_wtensor_t **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) return err_set(ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++)
        order[i] = &w->t[i];
    qsort(order, (size_t)n, sizeof *order, cmp_wtensor);

    // Header: __metadata__ first, then the tensors in data order, compact JSON
    // as the reference writer produces it, padded with spaces to a multiple of 8.
    strbuf_t h = {0};
    int rc = 0;
    strbuf_puts(&h, "{");
    int first = 1;
    if (meta && meta[0]) {
        strbuf_puts(&h, "\"__metadata__\":{");
        for (int i = 0; meta[i]; i += 2) {
            if (!meta[i + 1]) {
                rc = err_set(ERR_INPUT, "%s: metadata key %s has no value", path, meta[i]);
                break;
            }
            if (utf8_check((const uint8_t *)meta[i], strlen(meta[i])) != strlen(meta[i]) ||
                utf8_check((const uint8_t *)meta[i + 1], strlen(meta[i + 1])) != strlen(meta[i + 1])) {
                rc = err_set(ERR_INPUT, "%s: metadata key %s: not valid UTF-8", path, meta[i]);
                break;
            }
            if (i) strbuf_puts(&h, ",");
            strbuf_json_str(&h, meta[i]);
            strbuf_puts(&h, ":");
            strbuf_json_str(&h, meta[i + 1]);
        }
        strbuf_puts(&h, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const st_wtensor_t *t = order[i];
        if (!first) strbuf_puts(&h, ",");
        first = 0;
        strbuf_json_str(&h, t->name);
        strbuf_puts(&h, ":{\"dtype\":\"");
        strbuf_puts(&h, st_dtype_name(t->dtype));
        strbuf_puts(&h, "\",\"shape\":[");
        for (int k = 0; k < t->ndim; k++) {
            if (k) strbuf_puts(&h, ",");
            sb_fmt_u64(&h, (uint64_t)t->shape[k]);
        }
        strbuf_puts(&h, "],\"data_offsets\":[");
        sb_fmt_u64(&h, off);
        strbuf_puts(&h, ",");
        off += wbytes(t);
        sb_fmt_u64(&h, off);
        strbuf_puts(&h, "]}");
    }
    strbuf_puts(&h, "}");
    while (h.n % 8)
        strbuf_puts(&h, " ");
    if (rc == 0 && h.oom) rc = err_set(ERR_NOMEM, "%s: out of memory for the header", path);
    if (rc == 0 && h.n > ST_MAX_HEADER)
        rc = err_set(ERR_INPUT, "%s: header of %zu bytes exceeds the format's limit", path, h.n);

    const int64_t chunk = 1 << 20;
    uint16_t *tmp = NULL;
    afile_t af = {0};
    if (rc == 0 && !(tmp = malloc((size_t)chunk * sizeof *tmp))) rc = err_set(ERR_NOMEM, "%s: out of memory", path);
    if (rc == 0) rc = fs_atomic_open(&af, path);
    if (rc == 0) {
        uint8_t len[8];
        for (int i = 0; i < 8; i++)
            len[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
        rc = fs_write(&af, len, 8);
        if (rc == 0) rc = fs_write(&af, h.s, h.n);
        for (int i = 0; i < n && rc == 0; i++) {
            rc = write_tensor(&af, order[i], tmp, chunk);
            if (rc < 0) err_wrap(rc, "%s: tensor %s: ", path, order[i]->name);
        }
        if (rc == 0)
            rc = fs_atomic_commit(&af); // removes the temporary itself on failure
        else
            fs_atomic_abort(&af);
    }
    free(tmp);
    free(h.s);
    free(order);
    return rc;
}
