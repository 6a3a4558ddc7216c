// safetensors reader / writer / folder tests: round trips in F32, F16 and BF16
// (values, rounding, shapes, header bytes, order, metadata), shard folders with
// and without an index, every header corruption the reader must reject (with
// the file and tensor named in the message), and writes that fail leaving no
// file behind. All files live in a fresh temporary folder.
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "testutil.h"

#include "base/err.h"
#include "base/strbuf.h"
#include "io/safetensors.h"

// ---- helpers -------------------------------------------------------------------

// Writes a raw file: u64 header length (given, or the real one when hlen < 0),
// the header text, then nd bytes of data.
static void write_raw_len(const char *path, long long hlen, const char *header, const void *data, size_t nd) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = hlen < 0 ? strlen(header) : (uint64_t)hlen;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    if (header[0]) assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    if (nd) assert_int_equal(fwrite(data, 1, nd, f), nd);
    fclose(f);
    tu_corpus_save(path);
}

static void write_raw(const char *path, const char *header, const void *data, size_t nd) {
    write_raw_len(path, -1, header, data, nd);
}

// Number of entries in dir whose name contains `part`.
static int count_files(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

// Expects st_open to fail with ERR_INPUT (or `code`) and a message containing
// the file path and each of the given fragments.
static void expect_open_error(const char *path, int code, const char *frag1, const char *frag2) {
    st_file_t f;
    err_clear();
    int rc = st_open(&f, path);
    if (rc != code || !strstr(err_msg(), path) || (frag1 && !strstr(err_msg(), frag1)) ||
        (frag2 && !strstr(err_msg(), frag2)))
        fail_msg("%s: rc %d (want %d), message \"%s\" (want \"%s\" and \"%s\")", path, rc, code, err_msg(),
                 frag1 ? frag1 : "", frag2 ? frag2 : "");
    assert_null(f.tensors); // nothing left open
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

// ---- round trip ----------------------------------------------------------------

static void test_roundtrip(void **state) {
    (void)state;
    // F32 values written bit-exactly, including -0, a subnormal and the extremes.
    float w[6] = {1.0f, -2.5f, 3.14159265f, -0.0f, 1.0e-40f, 3.4028235e38f};
    float s[1] = {42.0f};
    // BF16 rounding, to nearest even on the 16 dropped bits:
    //   1 + 2^-8 is halfway between 1 and 1 + 2^-7 (odd)  -> 1
    //   1 + 3 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 -> 1 + 2^-6
    //   1 + 2^-8 + 2^-20 is above halfway -> 1 + 2^-7
    float bf[6] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -3.0f, 65536.0f, NAN};
    float bf_want[6] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -3.0f, 65536.0f, NAN};
    // F16: same rule on 13 dropped bits; 65504 is the largest finite, 2^-24 the
    // smallest subnormal, 1e-8 rounds to zero, 1e5 overflows to infinity.
    float h[8] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0.5f, -2.0f, 65504.0f, 0x1p-24f, 1e-8f, 1e5f};
    float h_want[8] = {1.0f, 1.0f + 0x1p-9f, 0.5f, -2.0f, 65504.0f, 0x1p-24f, 0.0f, INFINITY};

    st_writer_t wr;
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, "model.b.weight", ST_F32, 2, (int64_t[]){2, 3}, w), 0);
    assert_int_equal(st_writer_add(&wr, "a.half", ST_F16, 1, (int64_t[]){8}, h), 0);
    assert_int_equal(st_writer_add(&wr, "c.bf", ST_BF16, 3, (int64_t[]){3, 1, 2}, bf), 0);
    assert_int_equal(st_writer_add(&wr, "scalar", ST_F32, 0, NULL, s), 0);
    assert_int_equal(st_writer_add(&wr, "empty", ST_BF16, 2, (int64_t[]){0, 5}, NULL), 0);
    const char *meta[] = {"format", "pt", "note", "quote \" back\\slash\nnewline", NULL};
    const char *path = tu_tmp_path("rt.safetensors");
    assert_int_equal(st_writer_write(&wr, path, meta), 0);
    st_writer_free(&wr);
    tu_corpus_save(path);

    st_file_t f;
    assert_int_equal(st_open(&f, path), 0);
    assert_int_equal(f.n_tensors, 5);
    // Header: length a multiple of 8 (so the data is 8-aligned), padded with spaces.
    uint64_t hl = f.data_start - 8;
    assert_int_equal(hl % 8, 0);
    assert_memory_equal(f.buf + 8, "{\"__metadata__\":{\"format\":\"pt\",", 31);
    const char *h_end = memchr(f.buf + 8, '}', hl); // not a robust parse; the check below is
    assert_non_null(h_end);
    size_t last = hl;
    while (last > 0 && f.buf[8 + last - 1] == ' ')
        last--;
    assert_int_equal(f.buf[8 + last - 1], '}');
    assert_true(hl - last < 8);
    // Metadata, escapes included.
    assert_int_equal(f.n_meta, 2);
    assert_string_equal(st_meta(&f, "format"), "pt");
    assert_string_equal(st_meta(&f, "note"), "quote \" back\\slash\nnewline");
    assert_null(st_meta(&f, "absent"));

    // Order in the buffer: F32 (by name), then BF16 (by name), then F16.
    const char *order[5] = {"model.b.weight", "scalar", "c.bf", "empty", "a.half"};
    uint64_t pos = 0;
    for (int i = 0; i < 5; i++) {
        const st_tensor_t *t = st_find(&f, order[i]);
        assert_non_null(t);
        if (t->begin != pos)
            fail_msg("tensor %s begins at %llu, expected %llu", order[i], (unsigned long long)t->begin,
                     (unsigned long long)pos);
        pos = t->end;
    }
    assert_int_equal(pos, f.size - f.data_start);
    // The header lists them in that order too (as the reference writer does).
    for (int i = 0; i < 5; i++)
        assert_string_equal(f.tensors[i].name, order[i]);

    const st_tensor_t *t = st_find(&f, "model.b.weight");
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    float out[8];
    assert_int_equal(st_read_f32(&f, t, out), 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(f32_bits(out[i]), f32_bits(w[i]));

    t = st_find(&f, "c.bf");
    assert_int_equal(t->dtype, ST_BF16);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 12);
    assert_int_equal(st_read_f32(&f, t, out), 0);
    for (int i = 0; i < 5; i++)
        if (out[i] != bf_want[i]) fail_msg("bf16[%d]: %.9g, expected %.9g", i, out[i], bf_want[i]);
    assert_true(isnan(out[5]));

    t = st_find(&f, "a.half");
    assert_int_equal(t->dtype, ST_F16);
    assert_int_equal(st_read_f32(&f, t, out), 0);
    for (int i = 0; i < 8; i++)
        if (out[i] != h_want[i]) fail_msg("f16[%d]: %.9g, expected %.9g", i, out[i], h_want[i]);

    t = st_find(&f, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    assert_int_equal(st_read_f32(&f, t, out), 0);
    assert_true(out[0] == 42.0f);

    t = st_find(&f, "empty");
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(st_read_f32(&f, t, out), 0);
    assert_null(st_find(&f, "missing"));
    st_close(&f);
}

// The exact bytes of a one-tensor file, as the reference writer lays them out.
static void test_header_bytes(void **state) {
    (void)state;
    float x = 1.0f;
    st_writer_t wr;
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, "x", ST_F32, 1, (int64_t[]){1}, &x), 0);
    const char *path = tu_tmp_path("one.safetensors");
    assert_int_equal(st_writer_write(&wr, path, (const char *[]){"format", "pt", NULL}), 0);
    st_writer_free(&wr);
    tu_corpus_save(path);
    const char *want =
        "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t wl = strlen(want), padded = (wl + 7) / 8 * 8;
    FILE *f = fopen(path, "rb");
    uint8_t buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(n, 8 + padded + 4);
    assert_int_equal(buf[0], padded);
    for (int i = 1; i < 8; i++)
        assert_int_equal(buf[i], 0);
    assert_memory_equal(buf + 8, want, wl);
    for (size_t i = wl; i < padded; i++)
        assert_int_equal(buf[8 + i], ' ');
    assert_memory_equal(buf + 8 + padded, &x, 4);

    // No metadata: no __metadata__ key at all.
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, "x", ST_F32, 1, (int64_t[]){1}, &x), 0);
    assert_int_equal(st_writer_write(&wr, path, NULL), 0);
    st_writer_free(&wr);
    st_file_t sf;
    assert_int_equal(st_open(&sf, path), 0);
    assert_int_equal(sf.n_meta, 0);
    assert_memory_equal(sf.buf + 8, "{\"x\":", 5);
    st_close(&sf);
}

// The JSON string escaper of every writer (base/strbuf): its bytes are what
// Python's json.dumps(s, ensure_ascii=False) gives (and serde_json, the
// reference safetensors writer): short escapes where JSON has them, \u00xx for
// the other control characters, '/', DEL and UTF-8 as they are. A tensor name
// and metadata made of such text come back byte for byte.
static void test_json_escapes(void **state) {
    (void)state;
    const char *s = "q\"b\\s/\b\f\n\r\t\x01\x1f\x7f \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    const char *want = "\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"";
    strbuf_t b = {0};
    strbuf_json_str(&b, s);
    assert_false(b.oom);
    assert_string_equal(b.s, want);
    free(b.s);
    b = (strbuf_t){0};
    strbuf_json_str(&b, "");
    assert_string_equal(b.s, "\"\"");
    free(b.s);

    float x = 1.0f;
    st_writer_t wr;
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, s, ST_F32, 1, (int64_t[]){1}, &x), 0);
    const char *path = tu_tmp_path("escapes.safetensors");
    assert_int_equal(st_writer_write(&wr, path, (const char *[]){s, s, NULL}), 0);
    st_writer_free(&wr);
    tu_corpus_save(path);
    char head[512];
    snprintf(head, sizeof head,
             "{\"__metadata__\":{%s:%s},%s:{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", want, want,
             want);
    st_file_t f;
    assert_int_equal(st_open(&f, path), 0);
    assert_memory_equal(f.buf + 8, head, strlen(head));
    assert_string_equal(st_meta(&f, s), s);
    assert_non_null(st_find(&f, s));
    st_close(&f);
}

// Bigger tensors cross the writer's 1 Mi-element pieces and the 64 Ki-element
// conversion pieces, in BF16 and F16.
static void test_large_streamed(void **state) {
    (void)state;
    int64_t n = 3 * 700001; // 2.1 Mi elements, not a multiple of either piece size
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    tu_randn(x, n, 7, 1.0f);
    st_writer_t wr;
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, "big", ST_BF16, 2, (int64_t[]){n / 3, 3}, x), 0);
    assert_int_equal(st_writer_add(&wr, "big16", ST_F16, 1, &n, x), 0);
    const char *path = tu_tmp_path("big.safetensors");
    assert_int_equal(st_writer_write(&wr, path, NULL), 0);
    st_writer_free(&wr);
    st_file_t f;
    assert_int_equal(st_open(&f, path), 0);
    const st_tensor_t *t = st_find(&f, "big");
    assert_int_equal(t->numel, n);
    assert_int_equal(st_read_f32(&f, t, y), 0);
    // bf16 keeps 8 significant bits: rounding to nearest errs by at most half an
    // ulp, i.e. 2^-8 relative (the unit roundoff of an 8-bit significand).
    for (int64_t i = 0; i < n; i++)
        if (fabsf(y[i] - x[i]) > fabsf(x[i]) * 0x1p-8f) fail_msg("element %lld: %g vs %g", (long long)i, y[i], x[i]);
    // fp16: 11 significant bits, so 2^-11 relative; below 2^-14 the spacing is
    // the subnormal step 2^-24, half of which bounds the error.
    t = st_find(&f, "big16");
    assert_int_equal(st_read_f32(&f, t, y), 0);
    for (int64_t i = 0; i < n; i++)
        if (fabsf(y[i] - x[i]) > fmaxf(fabsf(x[i]) * 0x1p-11f, 0x1p-25f))
            fail_msg("f16 element %lld: %g vs %g", (long long)i, y[i], x[i]);
    st_close(&f);
    free(x);
    free(y);
}

// F64 converts; integer dtypes open but do not convert.
static void test_other_dtypes(void **state) {
    (void)state;
    double d[3] = {1.5, -1e300, 0.1};
    const char *path = tu_tmp_path("f64.safetensors");
    write_raw(path, "{\"d\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[0,24]}}", d, sizeof d);
    st_file_t f;
    assert_int_equal(st_open(&f, path), 0);
    float out[3];
    assert_int_equal(st_read_f32(&f, st_find(&f, "d"), out), 0);
    assert_true(out[0] == 1.5f && isinf(out[1]) && out[1] < 0 && out[2] == 0.1f);
    st_close(&f);

    int32_t ints[2] = {1, 2};
    path = tu_tmp_path("i32.safetensors");
    write_raw(path, "{\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", ints, sizeof ints);
    assert_int_equal(st_open(&f, path), 0);
    err_clear();
    assert_int_equal(st_read_f32(&f, st_find(&f, "ids"), out), ERR_UNSUP);
    assert_non_null(strstr(err_msg(), "ids"));
    assert_non_null(strstr(err_msg(), "I32"));
    assert_non_null(strstr(err_msg(), path));
    st_close(&f);

    // Sub-byte dtype with a whole number of bytes; unaligned data start (header 57 bytes).
    uint8_t nib[2] = {0x12, 0x34};
    path = tu_tmp_path("f4.safetensors");
    write_raw(path, "{\"q\":{\"dtype\":\"F4\",\"shape\":[2,2],\"data_offsets\":[0,2]}}", nib, 2);
    assert_int_equal(st_open(&f, path), 0);
    assert_int_equal(st_find(&f, "q")->nbytes, 2);
    st_close(&f);
    // F16 and BF16 at an odd byte offset (header 109 bytes): 1, -2 and 1, -3.
    uint8_t halves[8] = {0x00, 0x3c, 0x00, 0xc0, 0x80, 0x3f, 0x40, 0xc0};
    const char *hh = "{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}} ";
    assert_int_equal(strlen(hh) % 2, 1);
    path = tu_tmp_path("halves.safetensors");
    write_raw(path, hh, halves, sizeof halves);
    assert_int_equal(st_open(&f, path), 0);
    assert_int_equal(st_read_f32(&f, st_find(&f, "h"), out), 0);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    assert_int_equal(st_read_f32(&f, st_find(&f, "b"), out), 0);
    assert_true(out[0] == 1.0f && out[1] == -3.0f);
    st_close(&f);
    // Header padded with trailing whitespace and an empty file (no tensors) are valid.
    path = tu_tmp_path("empty.safetensors");
    write_raw(path, "{}      ", NULL, 0);
    assert_int_equal(st_open(&f, path), 0);
    assert_int_equal(f.n_tensors, 0);
    st_close(&f);
    // From memory, through the same parser.
    uint8_t mem[8 + 8] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    assert_int_equal(st_open_mem(&f, mem, sizeof mem, "mem"), 0);
    st_close(&f);
}

// ---- corruption ----------------------------------------------------------------

static void test_corrupt(void **state) {
    (void)state;
    static const uint8_t data[64]; // zeros: the tensor data of every case
#define T1 "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
    static const struct {
        const char *name;   // the file is <name>.safetensors
        long long hlen;     // the header length field; -1: the header's own length
        const char *header; // then nd bytes of data
        size_t nd;
        int code;
        const char *f1, *f2; // fragments the message must contain (besides the path)
    } cases[] = {
        {"huge_header", 100000001LL, "{" T1 "}", 8, ERR_INPUT, "exceeds the limit", "100000000"},
        {"past_end", 4096, "{" T1 "}", 8, ERR_INPUT, "runs past the end", NULL},
        {"not_json", -1, "{\"t\": {\"dtype\": ", 8, ERR_INPUT, "not valid JSON", NULL},
        {"not_object", -1, "[1, 2, 3]", 0, ERR_INPUT, "does not start with '{'", NULL},
        {"trailing", -1, "{" T1 "} x", 8, ERR_INPUT, "trailing bytes", NULL},
        {"utf8", -1, "{\"t\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, ERR_INPUT, "UTF-8",
         "byte 3 of the header"},
        {"utf8_overlong", -1, "{\"t\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, ERR_INPUT,
         "UTF-8", "byte 3 of the header"},
        {"utf8_surrogate", -1, "{\"t\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         ERR_INPUT, "UTF-8", "byte 3 of the header"},
        {"out_of_range", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, ERR_INPUT,
         "tensor t", "past the end"},
        {"reversed", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, ERR_INPUT, "tensor t",
         "end before they begin"},
        {"overlap", -1,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, ERR_INPUT, "overlap", "tensor b"},
        {"hole", -1,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, ERR_INPUT, "hole", "tensor b"},
        {"hole_end", -1, "{" T1 "}", 12, ERR_INPUT, "hole", "[8, 12)"}, // 4 bytes nobody owns at the end
        {"size_mismatch", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, ERR_INPUT,
         "tensor t", "needs 24 bytes"},
        {"bf16_mismatch", -1, "{\"t\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, ERR_INPUT,
         "tensor t", "needs 4 bytes"},
        {"dup", -1, "{" T1 ",\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, ERR_INPUT,
         "duplicate tensor name t", NULL},
        {"dtype", -1, "{\"t\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, ERR_INPUT, "tensor t",
         "unknown dtype \"F17\""},
        {"dtype_type", -1, "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, ERR_INPUT, "tensor t",
         "dtype"},
        {"no_offsets", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, ERR_INPUT, "tensor t",
         "missing data_offsets"},
        {"neg_shape", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, ERR_INPUT, "tensor t",
         "shape[0]"},
        {"frac_offset", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 8, ERR_INPUT,
         "tensor t", "data_offsets"},
        {"overflow", -1,
         "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
         ERR_INPUT, "tensor t", "more than 1099511627776 elements"},
        {"numel_limit", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[1048576,1048577],\"data_offsets\":[0,8]}}", 8,
         ERR_INPUT, "tensor t: shape[1] = 1048577", "more than 1099511627776 elements"},
        {"nibble", -1, "{\"t\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, ERR_INPUT, "tensor t",
         "whole number of bytes"},
        {"meta", -1, "{\"__metadata__\":{\"format\":1}," T1 "}", 8, ERR_INPUT, "__metadata__", "format"},
        {"rank", -1, "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, ERR_UNSUP,
         "tensor t", "9 dimensions"},
        {"tensor_not_obj", -1, "{\"t\":[1,2]}", 0, ERR_INPUT, "tensor t", "expected an object"},
    };
#undef T1
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", cases[i].name);
        const char *p = tu_tmp_path(name);
        write_raw_len(p, cases[i].hlen, cases[i].header, data, cases[i].nd);
        expect_open_error(p, cases[i].code, cases[i].f1, cases[i].f2);
    }

    const char *p = tu_tmp_path("short.safetensors");
    FILE *f = fopen(p, "wb"); // 5 bytes: shorter than the length field
    fwrite("abcde", 1, 5, f);
    fclose(f);
    expect_open_error(p, ERR_INPUT, "too short", NULL);

    expect_open_error(tu_tmp_path("does_not_exist.safetensors"), ERR_INPUT, "cannot open", NULL); // ENOENT is ERR_INPUT
}

// ---- folders -------------------------------------------------------------------

static void write_one(const char *path, const char *name, int n, float base) {
    float x[16];
    for (int i = 0; i < n; i++)
        x[i] = base + (float)i;
    st_writer_t wr;
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, name, ST_F32, 1, (int64_t[]){n}, x), 0);
    assert_int_equal(st_writer_write(&wr, path, NULL), 0);
    st_writer_free(&wr);
    tu_corpus_save(path);
}

static void write_two(const char *path, const char *n1, const char *n2) {
    float x[4] = {1, 2, 3, 4}, y[2] = {5, 6};
    st_writer_t wr;
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, n1, ST_BF16, 2, (int64_t[]){2, 2}, x), 0);
    assert_int_equal(st_writer_add(&wr, n2, ST_F32, 1, (int64_t[]){2}, y), 0);
    assert_int_equal(st_writer_write(&wr, path, NULL), 0);
    st_writer_free(&wr);
    tu_corpus_save(path);
}

static void write_text(const char *path, const char *text) {
    assert_int_equal(fs_write_all(path, text, strlen(text)), 0);
}

static const char *mkdir_t(const char *name) {
    const char *d = tu_tmp_path(name);
    assert_int_equal(fs_mkdir_p(d), 0);
    return d;
}

static void expect_set_error(const char *dir, const char *frag1, const char *frag2) {
    st_set_t s;
    err_clear();
    int rc = st_set_open(&s, dir);
    if (rc >= 0 || (frag1 && !strstr(err_msg(), frag1)) || (frag2 && !strstr(err_msg(), frag2)))
        fail_msg("%s: rc %d, message \"%s\" (want \"%s\" and \"%s\")", dir, rc, err_msg(), frag1 ? frag1 : "",
                 frag2 ? frag2 : "");
    assert_null(s.files);
}

static void test_sharded_index(void **state) {
    (void)state;
    const char *d = mkdir_t("sharded");
    char p1[600], p2[600], pi[600];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", d);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", d);
    snprintf(pi, sizeof pi, "%s/model.safetensors.index.json", d);
    write_two(p1, "model.embed_tokens.weight", "model.norm.weight");
    write_one(p2, "lm_head.weight", 3, 10.0f);
    write_text(pi, "{\"metadata\": {\"total_size\": 22}, \"weight_map\": {"
                   "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                   "\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
                   "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
    st_set_t s;
    assert_int_equal(st_set_open(&s, d), 0);
    assert_int_equal(s.n_files, 2);
    assert_int_equal(s.n_index, 3);
    const st_file_t *f;
    const st_tensor_t *t = st_set_find(&s, "lm_head.weight", &f);
    assert_non_null(t);
    assert_string_equal(f->path, p2);
    float out[4];
    assert_int_equal(st_set_read_f32(&s, "lm_head.weight", out), 0);
    assert_true(out[0] == 10.0f && out[2] == 12.0f);
    assert_int_equal(st_set_read_f32(&s, "model.embed_tokens.weight", out), 0);
    assert_true(out[0] == 1.0f && out[3] == 4.0f);
    t = st_set_find(&s, "model.norm.weight", &f);
    assert_string_equal(f->path, p1);
    assert_null(st_set_find(&s, "nope", NULL));
    err_clear();
    assert_int_equal(st_set_read_f32(&s, "nope", out), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "nope"));
    st_set_close(&s);

    // A shard the map names does not exist.
    write_text(pi, "{\"weight_map\": {\"lm_head.weight\": \"model-00003-of-00002.safetensors\"}}");
    expect_set_error(d, "model-00003-of-00002.safetensors", "does not exist");
    // A tensor not in the shard the map names.
    write_text(pi, "{\"weight_map\": {\"lm_head.weight\": \"model-00001-of-00002.safetensors\","
                   "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    expect_set_error(d, "lm_head.weight", "not found in its shard");
    // A path outside the folder.
    write_text(pi, "{\"weight_map\": {\"lm_head.weight\": \"../model-00001-of-00002.safetensors\"}}");
    expect_set_error(d, "lm_head.weight", "not a file name inside the folder");
    // No weight_map / not JSON.
    write_text(pi, "{\"metadata\": {}}");
    expect_set_error(d, "weight_map", NULL);
    write_text(pi, "{\"weight_map\": ");
    expect_set_error(d, pi, "not a JSON object");
    // A broken shard is reported with its own path.
    write_text(pi, "{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
    write_raw(p2, "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", out, 8);
    expect_set_error(d, p2, "needs 12 bytes");
}

// Without an index every *.safetensors is read; a name in two files is an error;
// model.safetensors alone wins over other files.
static void test_folder_scan(void **state) {
    (void)state;
    const char *d = mkdir_t("scan");
    char p1[600], p2[600], p3[600];
    snprintf(p1, sizeof p1, "%s/a.safetensors", d);
    snprintf(p2, sizeof p2, "%s/b.safetensors", d);
    snprintf(p3, sizeof p3, "%s/model.safetensors", d);
    write_one(p1, "x", 2, 1.0f);
    write_one(p2, "y", 2, 3.0f);
    write_text(tu_tmp_path("scan/notes.txt"), "not a model");
    st_set_t s;
    assert_int_equal(st_set_open(&s, d), 0);
    assert_int_equal(s.n_files, 2);
    assert_non_null(st_set_find(&s, "x", NULL));
    assert_non_null(st_set_find(&s, "y", NULL));
    st_set_close(&s);

    write_one(p2, "x", 2, 3.0f);
    expect_set_error(d, "tensor x is in both", "b.safetensors");

    write_one(p3, "z", 2, 5.0f);
    assert_int_equal(st_set_open(&s, d), 0);
    assert_int_equal(s.n_files, 1);
    assert_non_null(st_set_find(&s, "z", NULL));
    assert_null(st_set_find(&s, "x", NULL));
    st_set_close(&s);

    expect_set_error(mkdir_t("nothing"), "no model.safetensors", NULL);
    expect_set_error(tu_tmp_path("missing_dir"), "not a folder", NULL);
}

// ---- failing writes ------------------------------------------------------------

static void test_write_failures(void **state) {
    (void)state;
    float x[4] = {0};
    st_writer_t wr;
    st_writer_init(&wr);
    // Rejected additions name the tensor.
    err_clear();
    assert_int_equal(st_writer_add(&wr, "w", ST_I32, 1, (int64_t[]){4}, x), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "tensor w"));
    assert_int_equal(st_writer_add(&wr, "__metadata__", ST_F32, 1, (int64_t[]){4}, x), ERR_INPUT);
    assert_int_equal(st_writer_add(&wr, "neg", ST_F32, 1, (int64_t[]){-4}, x), ERR_INPUT);
    assert_int_equal(st_writer_add(&wr, "w", ST_F32, 1, (int64_t[]){4}, x), 0);
    assert_int_equal(st_writer_add(&wr, "w", ST_F16, 1, (int64_t[]){4}, x), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "duplicate tensor w"));

    // A missing folder: error, nothing created.
    err_clear();
    assert_true(st_writer_write(&wr, tu_tmp_path("no/such/dir/m.safetensors"), NULL) < 0);
    assert_non_null(strstr(err_msg(), "no/such/dir/m.safetensors"));
    // A "folder" that is a file.
    write_text(tu_tmp_path("plainfile"), "x");
    assert_true(st_writer_write(&wr, tu_tmp_path("plainfile/m.safetensors"), NULL) < 0);
    st_writer_free(&wr);

    // A write that fails midway (file size limit): error, neither the file nor
    // its temporary remains. 64 KiB of data against a 16 KiB limit.
    const char *d = mkdir_t("fsize");
    int64_t n = 16384;
    float *big = calloc((size_t)n, sizeof *big);
    st_writer_init(&wr);
    assert_int_equal(st_writer_add(&wr, "big", ST_F32, 1, &n, big), 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 16384;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN); // report EFBIG instead of killing the process
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/m.safetensors", d);
    err_clear();
    int rc = st_writer_write(&wr, path, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, ERR_IO);
    assert_non_null(strstr(err_msg(), "m.safetensors"));
    assert_int_equal(count_files(d, "m.safetensors"), 0); // neither m.safetensors nor m.safetensors.tmp.*
    // The same write without the limit succeeds and leaves exactly one file.
    assert_int_equal(st_writer_write(&wr, path, NULL), 0);
    assert_int_equal(count_files(d, "m.safetensors"), 1);
    st_writer_free(&wr);
    free(big);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),      cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_json_escapes),   cmocka_unit_test(test_large_streamed),
        cmocka_unit_test(test_other_dtypes),   cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_sharded_index),  cmocka_unit_test(test_folder_scan),
        cmocka_unit_test(test_write_failures),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
