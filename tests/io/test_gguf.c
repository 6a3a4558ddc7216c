// GGUF reader tests.
//  - The real SmolLM2-135M-Instruct Q4_1 file (HYLO_MODEL): header, tensor
//    table, metadata values, and every Q4_1 / Q8_0 / F32 tensor decoded again
//    here from the raw bytes with the formulas of formats.md 2.5 (and an fp16
//    decoder of our own), compared exactly.
//  - A synthetic GGUF built here with one tensor per supported type, whose
//    blocks are packed from known integers with the layouts of formats.md 2.5,
//    so the decoded values are known exactly.
//  - Corrupted variants of the synthetic file: each must fail with a message
//    naming the problem (run under ASan too: make MODE=asan).
//  - Llama q/k rows: a synthetic llama GGUF whose attn_q / attn_k rows were
//    permuted here with llama.cpp's conversion formula from known HF matrices,
//    read back through wsrc_open / wsrc_read (what the model loader calls):
//    the HF matrices must come back bit for bit (MHA, GQA, odd dh/2), attn_v
//    and a qwen3 file (no permutation) must come back as stored.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#include "base/err.h"
#include "base/fs.h"
#include "io/gguf.h"
#include "io/weights.h"

// IEEE half -> double, written from the definition (not base/half.h).
static double ref_half(const uint8_t *p) {
    unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8;
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return s ? -v : v;
}

// ---- the real file ------------------------------------------------------------------

static void test_real_header(void **state) {
    (void)state;
    const char *path = tu_model_path();
    gguf_t g;
    if (gguf_open(&g, path) < 0) fail_msg("%s", err_msg());
    assert_int_equal(g.version, 3);
    assert_int_equal(g.n_tensors, 272);
    assert_int_equal(g.alignment, 32);
    assert_int_equal(g.mf.size, 98362432);
    int n_q41 = 0, n_q80 = 0, n_f32 = 0;
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor_t *t = &g.tensors[i];
        n_q41 += t->type == GGML_Q4_1;
        n_q80 += t->type == GGML_Q8_0;
        n_f32 += t->type == GGML_F32;
        bytes += t->nbytes;
        assert_int_equal(t->offset % 32, 0);
        assert_true(t->offset >= g.data_start && t->offset + t->nbytes <= g.mf.size);
        // 2-D weights are Q4_1 (the embedding Q8_0), 1-D norms F32 (formats.md 6.4).
        if (t->n_dims == 1) assert_int_equal(t->type, GGML_F32);
    }
    assert_int_equal(n_q41, 210);
    assert_int_equal(n_q80, 1);
    assert_int_equal(n_f32, 61);
    assert_int_equal(bytes, 96576768); // 30,081,024 + 66,355,200 + 140,544
    const gguf_tensor_t *t = gguf_find_tensor(&g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, GGML_Q8_0);
    assert_int_equal(t->ne[0], 576);
    assert_int_equal(t->ne[1], 49152);
    assert_int_equal(t->nbytes, 30081024);
    t = gguf_find_tensor(&g, "blk.29.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->type, GGML_Q4_1);
    assert_int_equal(t->ne[0], 1536);
    assert_int_equal(t->ne[1], 576);
    t = gguf_find_tensor(&g, "blk.0.attn_k.weight");
    assert_int_equal(t->ne[1], 192);                    // 3 kv heads x 64
    assert_null(gguf_find_tensor(&g, "output.weight")); // tied embeddings
    assert_null(gguf_find_tensor(&g, "rope_freqs.weight"));

    // Metadata.
    const char *s;
    size_t len;
    int64_t v;
    double f;
    assert_int_equal(gguf_get_str(&g, "general.architecture", &s, &len), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    static const struct {
        const char *key;
        int64_t want;
    } ints[] = {{"llama.block_count", 30},
                {"llama.embedding_length", 576},
                {"llama.feed_forward_length", 1536},
                {"llama.attention.head_count", 9},
                {"llama.attention.head_count_kv", 3},
                {"llama.context_length", 8192},
                {"llama.rope.dimension_count", 64},
                {"llama.vocab_size", 49152},
                {"general.file_type", 3},
                {"general.quantization_version", 2},
                {"tokenizer.ggml.bos_token_id", 1},
                {"tokenizer.ggml.eos_token_id", 2},
                {"tokenizer.ggml.padding_token_id", 2},
                {"tokenizer.ggml.unknown_token_id", 0}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if (gguf_get_int(&g, ints[i].key, &v) < 0) fail_msg("%s", err_msg());
        if (v != ints[i].want) fail_msg("%s = %lld, expected %lld", ints[i].key, (long long)v, (long long)ints[i].want);
    }
    assert_int_equal(gguf_get_float(&g, "llama.rope.freq_base", &f), 0);
    assert_true(f == 100000.0);
    assert_int_equal(gguf_get_float(&g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
    assert_true((float)f == 1e-5f);
    int b = -1;
    assert_int_equal(gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &b), 0);
    assert_int_equal(b, 0);
    assert_int_equal(gguf_get_str(&g, "tokenizer.ggml.model", &s, &len), 0);
    assert_true(len == 4 && !memcmp(s, "gpt2", 4));
    assert_int_equal(gguf_get_str(&g, "tokenizer.ggml.pre", &s, &len), 0);
    assert_true(len == 6 && !memcmp(s, "smollm", 6));
    assert_int_equal(gguf_get_str(&g, "tokenizer.chat_template", &s, &len), 0);
    assert_true(len > 100 && !memcmp(s, "{% for message in messages %}", 29));

    const gguf_kv_t *kv;
    assert_int_equal(gguf_get_arr(&g, "tokenizer.ggml.tokens", GGUF_STRING, &kv), 0);
    assert_int_equal(kv->arr_n, 49152);
    static const char *const first[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++) {
        s = gguf_arr_str(kv, (uint64_t)i, &len);
        assert_true(len == strlen(first[i]) && !memcmp(s, first[i], len));
    }
    assert_int_equal(gguf_get_arr(&g, "tokenizer.ggml.merges", GGUF_STRING, &kv), 0);
    assert_int_equal(kv->arr_n, 48900);
    static const char *const merges[] = {"\xc4\xa0 t", "\xc4\xa0 a", "i n", "h e"}; // "Ġ t", ...
    for (int i = 0; i < 4; i++) {
        s = gguf_arr_str(kv, (uint64_t)i, &len);
        assert_true(len == strlen(merges[i]) && !memcmp(s, merges[i], len));
    }
    assert_int_equal(gguf_get_arr(&g, "tokenizer.ggml.token_type", GGUF_INT32, &kv), 0);
    assert_int_equal(kv->arr_n, 49152);
    for (int i = 0; i < 3; i++)
        assert_int_equal(gguf_arr_int(kv, (uint64_t)i), 3); // control tokens
    // Typed getters refuse other types and name the key.
    err_clear();
    assert_int_equal(gguf_get_int(&g, "general.architecture", &v), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "general.architecture is string"));
    assert_int_equal(gguf_get_arr(&g, "tokenizer.ggml.tokens", GGUF_INT32, &kv), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "array of string"));
    assert_int_equal(gguf_get_float(&g, "no.such.key", &f), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "missing metadata key no.such.key"));
    v = 77;
    assert_int_equal(gguf_opt_int(&g, "no.such.key", &v), 0);
    assert_int_equal(v, 77);
    gguf_close(&g);
}

// Decodes every tensor with the library and again here from the raw bytes.
static void test_real_dequant(void **state) {
    (void)state;
    const char *path = tu_model_path();
    gguf_t g;
    if (gguf_open(&g, path) < 0) fail_msg("%s", err_msg());
    float *out = malloc(576 * 49152 * sizeof(float));
    assert_non_null(out);
    int checked = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor_t *t = &g.tensors[i];
        assert_int_equal(gguf_read_tensor_f32(&g, t, out), 0);
        const uint8_t *raw = g.mf.data + t->offset;
        for (int64_t e = 0; e < t->nelem; e++) {
            float want;
            if (t->type == GGML_F32) {
                memcpy(&want, raw + 4 * e, 4);
            } else if (t->type == GGML_Q8_0) { // half d; int8 qs[32]: x = qs * d
                const uint8_t *blk = raw + (e / 32) * 34;
                want = (float)((int8_t)blk[2 + e % 32]) * (float)ref_half(blk);
            } else { // Q4_1: half d; half m; qs[16]: low nibbles are 0..15, high 16..31; x = q d + m
                const uint8_t *blk = raw + (e / 32) * 20;
                int j = (int)(e % 32);
                int q = j < 16 ? blk[4 + j] & 15 : blk[4 + j - 16] >> 4;
                want = (float)q * (float)ref_half(blk) + (float)ref_half(blk + 2);
            }
            if (memcmp(&out[e], &want, 4))
                fail_msg("%s element %lld: %.9g, expected %.9g", t->name, (long long)e, out[e], want);
        }
        checked++;
    }
    assert_int_equal(checked, 272);
    // The values are weights, not garbage: norms near 1, embeddings small.
    const gguf_tensor_t *t = gguf_find_tensor(&g, "output_norm.weight");
    assert_int_equal(gguf_read_tensor_f32(&g, t, out), 0);
    double mean = 0;
    for (int e = 0; e < 576; e++)
        mean += out[e] / 576.0;
    assert_true(mean > 0.1 && mean < 10);
    free(out);
    gguf_close(&g);
}

// ---- a synthetic file ---------------------------------------------------------------

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->b = realloc(b->b, b->cap);
        assert_non_null(b->b);
    }
    if (n) memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

typedef struct {
    const char *name;
    uint32_t type;
    uint32_t nd;
    uint64_t ne[5];
    const void *data;
    size_t nbytes;
    int64_t offset; // relative to the data section; -1 = next aligned position
} gt_t;

// An extra metadata key: GGUF_UINT32 or GGUF_FLOAT32 with value v, or GGUF_STRING with value s.
typedef struct {
    const char *key;
    uint32_t type;
    double v;
    const char *s;
} gkv_t;

// Everything a corruption test may change; zero / -1 fields mean "as built".
typedef struct {
    uint32_t magic, version;
    int64_t n_tensors, n_kv; // header counts (-1: the real ones)
    uint64_t arch_len;       // length field of general.architecture's value (0: real)
    uint64_t arr_n;          // element count of test.i64 (0: real)
    uint32_t kv_type;        // value type of test.u8 (0: real)
    uint32_t alignment;      // general.alignment key (0: no key, default 32)
    size_t truncate;         // cut the file to this many bytes (0: no cut)
    const char *arch;        // general.architecture (NULL: "llama")
    const gkv_t *extra;      // more keys after the fixed ones
    int n_extra;
} gspec_t;

static const gspec_t SPEC0 = {0x46554747u, 3, -1, -1, 0, 0, 0, 0, 0, NULL, NULL, 0};

// Builds the file: 7 metadata keys (+ alignment, + extra), tensor infos, zero
// padding to the alignment, tensor data at their offsets.
static buf_t build(const gspec_t *s, const gt_t *t, int nt) {
    buf_t b = {0};
    uint32_t align = s->alignment ? s->alignment : 32;
    const char *arch = s->arch ? s->arch : "llama";
    put_u32(&b, s->magic);
    put_u32(&b, s->version);
    put_u64(&b, s->n_tensors >= 0 ? (uint64_t)s->n_tensors : (uint64_t)nt);
    put_u64(&b, s->n_kv >= 0 ? (uint64_t)s->n_kv : (uint64_t)(7 + (s->alignment != 0) + s->n_extra));
    put_str(&b, "general.architecture");
    put_u32(&b, GGUF_STRING);
    put_u64(&b, s->arch_len ? s->arch_len : strlen(arch));
    put(&b, arch, strlen(arch));
    put_str(&b, "test.u8");
    put_u32(&b, s->kv_type ? s->kv_type : GGUF_UINT8);
    put(&b, "\x07", 1);
    put_str(&b, "test.f32");
    put_u32(&b, GGUF_FLOAT32);
    float f = 1.5f;
    put(&b, &f, 4);
    put_str(&b, "test.bool");
    put_u32(&b, GGUF_BOOL);
    put(&b, "\x01", 1);
    put_str(&b, "test.strs");
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, 3);
    put_str(&b, "a");
    put_str(&b, "bc");
    put_str(&b, "");
    put_str(&b, "test.i64");
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_INT64);
    put_u64(&b, s->arr_n ? s->arr_n : 2);
    put_u64(&b, 5);
    put_u64(&b, (uint64_t)-9);
    put_str(&b, "test.nested"); // an array of arrays, kept but not indexed
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_ARRAY);
    put_u64(&b, 2);
    for (int k = 0; k < 2; k++) {
        put_u32(&b, GGUF_UINT16);
        put_u64(&b, 1);
        uint16_t x = (uint16_t)k;
        put(&b, &x, 2);
    }
    if (s->alignment) {
        put_str(&b, "general.alignment");
        put_u32(&b, GGUF_UINT32);
        put_u32(&b, s->alignment);
    }
    for (int i = 0; i < s->n_extra; i++) {
        put_str(&b, s->extra[i].key);
        put_u32(&b, s->extra[i].type);
        if (s->extra[i].type == GGUF_FLOAT32) {
            float x = (float)s->extra[i].v;
            put(&b, &x, 4);
        } else if (s->extra[i].type == GGUF_STRING) {
            put_str(&b, s->extra[i].s);
        } else {
            put_u32(&b, (uint32_t)s->extra[i].v);
        }
    }
    uint64_t next = 0, offs[16];
    for (int i = 0; i < nt; i++) {
        put_str(&b, t[i].name);
        put_u32(&b, t[i].nd);
        for (uint32_t d = 0; d < t[i].nd; d++)
            put_u64(&b, t[i].ne[d]);
        put_u32(&b, t[i].type);
        offs[i] = t[i].offset >= 0 ? (uint64_t)t[i].offset : next;
        put_u64(&b, offs[i]);
        next = (offs[i] + t[i].nbytes + align - 1) / align * align;
    }
    while (b.n % align)
        put(&b, "", 1);
    size_t data_start = b.n;
    for (int i = 0; i < nt; i++) {
        if (offs[i] > (1u << 20)) continue; // a deliberately wild offset: no data there
        size_t end = data_start + offs[i] + t[i].nbytes;
        while (b.n < end)
            put(&b, "", 1);
        memcpy(b.b + data_start + offs[i], t[i].data, t[i].nbytes);
    }
    if (s->truncate && s->truncate < b.n) b.n = s->truncate;
    return b;
}

// Plain stdio: fs_write_all's fsync would make the hundreds of files below slow.
static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static const char *write_file(const char *name, const buf_t *b) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    write_bytes(path, b->b, b->n);
    tu_corpus_save(path);
    return path;
}

static void h16(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

// Tensor data for the synthetic file and the values each must decode to.
typedef struct {
    float f32[8], f32_want[8];
    uint8_t f16[16];
    float f16_want[8];
    uint8_t bf16[8];
    float bf16_want[4];
    uint8_t q4_0[4 * 18];
    float q4_0_want[128];
    uint8_t q4_1[20];
    float q4_1_want[32];
    uint8_t q8_0[34];
    float q8_0_want[32];
    uint8_t q4_k[144];
    float q4_k_want[256];
    uint8_t q6_k[2 * 210];
    float q6_k_want[512];
    uint8_t q5_k[176];
} synth_t;

static void make_synth(synth_t *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 8; i++)
        s->f32[i] = s->f32_want[i] = (float)i * 0.75f - 2.0f;

    // F16 / BF16: bit patterns and their values.
    static const uint16_t hb[8] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8400, 0x3555, 0x7c00, 0x0000};
    const float hv[8] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, -0x1p-14f, 0.333251953125f, INFINITY, 0.0f};
    for (int i = 0; i < 8; i++) {
        h16(s->f16 + 2 * i, hb[i]);
        s->f16_want[i] = hv[i];
    }
    static const uint16_t bb[4] = {0x3f80, 0xc040, 0x4049, 0x0001};
    const float bv[4] = {1.0f, -3.0f, 3.140625f, 0x1p-133f};
    for (int i = 0; i < 4; i++) {
        h16(s->bf16 + 2 * i, bb[i]);
        s->bf16_want[i] = bv[i];
    }

    // Q4_0 (4 blocks): half d; qs[16], element j < 16 the low nibble of qs[j],
    // element j + 16 its high nibble; x = (q - 8) d.
    static const uint16_t q40_d[4] = {0x3800, 0xb400, 0x4000, 0x3c00}; // 0.5, -0.25, 2, 1
    const float q40_dv[4] = {0.5f, -0.25f, 2.0f, 1.0f};
    for (int k = 0; k < 4; k++) {
        uint8_t *blk = s->q4_0 + 18 * k;
        h16(blk, q40_d[k]);
        for (int e = 0; e < 32; e++) {
            int q = (e * 7 + 3 * k + 3) % 16;
            if (e < 16)
                blk[2 + e] |= (uint8_t)q;
            else
                blk[2 + e - 16] |= (uint8_t)(q << 4);
            s->q4_0_want[32 * k + e] = (float)(q - 8) * q40_dv[k];
        }
    }
    // Q4_1: half d; half m; qs[16]; x = q d + m (d 0.5, m -1).
    h16(s->q4_1, 0x3800);
    h16(s->q4_1 + 2, 0xbc00);
    for (int e = 0; e < 32; e++) {
        int q = (e * 5 + 1) % 16;
        s->q4_1[4 + e % 16] |= (uint8_t)(e < 16 ? q : q << 4);
        s->q4_1_want[e] = (float)q * 0.5f - 1.0f;
    }
    // Q8_0: half d; int8 qs[32]; x = q d (d 0.25, q from -128 up in steps of 8).
    h16(s->q8_0, 0x3400);
    for (int e = 0; e < 32; e++) {
        int q = -128 + 8 * e + (e == 31 ? 7 : 0); // ends at 127
        s->q8_0[2 + e] = (uint8_t)(int8_t)q;
        s->q8_0_want[e] = (float)q * 0.25f;
    }
    // Q4_K: half d; half dmin; scales[12]; qs[128]. 8 sub-blocks of 32 with
    // 6-bit scale sc and min m: sub-block j < 4 keeps them in the low 6 bits of
    // scales[j] / scales[j+4]; j >= 4 keeps the low 4 bits in scales[j+4]
    // (sc low nibble, m high nibble) and the top 2 bits in the top bits of
    // scales[j-4] (sc) / scales[j] (m). Chunk c of 64 elements: the low nibbles
    // of qs[32c..32c+31] are sub-block 2c, the high nibbles sub-block 2c+1.
    // x = d sc q - dmin m, with d 0.25, dmin 0.125.
    static const int sc[8] = {1, 17, 33, 63, 5, 40, 22, 9}, mn[8] = {0, 3, 63, 16, 31, 8, 48, 2};
    h16(s->q4_k, 0x3400);
    h16(s->q4_k + 2, 0x3000);
    uint8_t *scales = s->q4_k + 4, *qs = s->q4_k + 16;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (int e = 0; e < 256; e++) {
        int q = (e * 5 + e / 7) % 16, sub = e / 32, c = e / 64, l = e % 32;
        qs[32 * c + l] |= (uint8_t)(sub % 2 == 0 ? q : q << 4);
        s->q4_k_want[e] = 0.25f * (float)sc[sub] * (float)q - 0.125f * (float)mn[sub];
    }
    // Q6_K (2 super-blocks): ql[128]; qh[64]; int8 scales[16]; half d. Half h of
    // 128 elements uses ql[64h..], qh[32h..]; for l < 32 the four elements l,
    // l+32, l+64, l+96 take their low 4 bits from ql[l] (low), ql[l+32] (low),
    // ql[l] (high), ql[l+32] (high) and their top 2 bits from qh[l] bits 0-1,
    // 2-3, 4-5, 6-7. Element e has scale scales[e/16]; x = d scale (q - 32).
    static const int8_t s6[16] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16};
    for (int k = 0; k < 2; k++) {
        uint8_t *blk = s->q6_k + 210 * k, *ql = blk, *qh = blk + 128;
        memcpy(blk + 192, s6, 16);
        h16(blk + 208, k ? 0x3800 : 0x3c00); // d = 1, then 0.5
        float d = k ? 0.5f : 1.0f;
        int q[256];
        for (int e = 0; e < 256; e++)
            q[e] = (e * 11 + 5 + 17 * k) % 64;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                int b0 = 128 * h + l, q1 = q[b0], q2 = q[b0 + 32], q3 = q[b0 + 64], q4 = q[b0 + 96];
                ql[64 * h + l] = (uint8_t)((q1 & 15) | (q3 & 15) << 4);
                ql[64 * h + l + 32] = (uint8_t)((q2 & 15) | (q4 & 15) << 4);
                qh[32 * h + l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        for (int e = 0; e < 256; e++)
            s->q6_k_want[256 * k + e] = d * (float)s6[e / 16] * (float)(q[e] - 32);
    }
}

#define NT 9
static void synth_tensors(const synth_t *s, gt_t *t) {
    const gt_t all[NT] = {
        {"f32", GGML_F32, 1, {8}, s->f32, 32, -1},       {"f16", GGML_F16, 1, {8}, s->f16, 16, -1},
        {"bf16", GGML_BF16, 2, {2, 2}, s->bf16, 8, -1},  {"q4_0", GGML_Q4_0, 2, {64, 2}, s->q4_0, 72, -1},
        {"q4_1", GGML_Q4_1, 1, {32}, s->q4_1, 20, -1},   {"q8_0", GGML_Q8_0, 1, {32}, s->q8_0, 34, -1},
        {"q4_k", GGML_Q4_K, 1, {256}, s->q4_k, 144, -1}, {"q6_k", GGML_Q6_K, 3, {256, 1, 2}, s->q6_k, 420, -1},
        {"q5_k", GGML_Q5_K, 1, {256}, s->q5_k, 176, -1}, // valid file, no dequantiser
    };
    memcpy(t, all, sizeof all);
}

static void test_synthetic(void **state) {
    (void)state;
    synth_t *s = malloc(sizeof *s);
    make_synth(s);
    gt_t t[NT];
    synth_tensors(s, t);
    buf_t b = build(&SPEC0, t, NT);
    const char *path = write_file("synth.gguf", &b);
    free(b.b);
    gguf_t g;
    if (gguf_open(&g, path) < 0) fail_msg("%s", err_msg());
    assert_int_equal(g.n_tensors, NT);
    assert_int_equal(g.n_kv, 7);
    assert_int_equal(g.data_start % 32, 0);

    // Metadata of every kind.
    int64_t v;
    double f;
    int bo;
    assert_int_equal(gguf_get_int(&g, "test.u8", &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(gguf_get_float(&g, "test.f32", &f), 0);
    assert_true(f == 1.5);
    assert_int_equal(gguf_get_bool(&g, "test.bool", &bo), 0);
    assert_int_equal(bo, 1);
    const gguf_kv_t *kv;
    assert_int_equal(gguf_get_arr(&g, "test.strs", GGUF_STRING, &kv), 0);
    size_t len;
    const char *str = gguf_arr_str(kv, 1, &len);
    assert_true(len == 2 && !memcmp(str, "bc", 2));
    gguf_arr_str(kv, 2, &len);
    assert_int_equal(len, 0);
    assert_int_equal(gguf_get_arr(&g, "test.i64", GGUF_INT64, &kv), 0);
    assert_int_equal(gguf_arr_int(kv, 0), 5);
    assert_int_equal(gguf_arr_int(kv, 1), -9);
    assert_non_null(gguf_find(&g, "test.nested"));

    static const struct {
        const char *name;
        size_t want_off;
        int n;
    } checks[] = {
        {"f32", offsetof(synth_t, f32_want), 8},     {"f16", offsetof(synth_t, f16_want), 8},
        {"bf16", offsetof(synth_t, bf16_want), 4},   {"q4_0", offsetof(synth_t, q4_0_want), 128},
        {"q4_1", offsetof(synth_t, q4_1_want), 32},  {"q8_0", offsetof(synth_t, q8_0_want), 32},
        {"q4_k", offsetof(synth_t, q4_k_want), 256}, {"q6_k", offsetof(synth_t, q6_k_want), 512},
    };
    float out[512];
    for (size_t c = 0; c < sizeof checks / sizeof *checks; c++) {
        const gguf_tensor_t *tt = gguf_find_tensor(&g, checks[c].name);
        assert_non_null(tt);
        assert_int_equal(tt->nelem, checks[c].n);
        if (gguf_read_tensor_f32(&g, tt, out) < 0) fail_msg("%s", err_msg());
        const float *want = (const float *)((const char *)s + checks[c].want_off);
        for (int e = 0; e < checks[c].n; e++)
            if (memcmp(&out[e], &want[e], 4))
                fail_msg("%s element %d: %.9g, expected %.9g", checks[c].name, e, out[e], want[e]);
    }
    // Known type without a dequantiser: the file opens, the read says so.
    err_clear();
    assert_int_equal(gguf_read_tensor_f32(&g, gguf_find_tensor(&g, "q5_k"), out), ERR_UNSUP);
    assert_non_null(strstr(err_msg(), "q5_k"));
    assert_non_null(strstr(err_msg(), "Q5_K"));
    gguf_close(&g);
    free(s);
}

// ---- corruption -------------------------------------------------------------------------

static void run_corrupt(const char *what, const gspec_t *spec, const gt_t *t, int nt, int code, const char *f1,
                        const char *f2) {
    buf_t b = build(spec, t, nt);
    char name[128];
    snprintf(name, sizeof name, "bad_%s.gguf", what);
    for (char *p = name; *p; p++)
        if (*p == ' ') *p = '_';
    const char *path = write_file(name, &b);
    free(b.b);
    gguf_t g;
    err_clear();
    int rc = gguf_open(&g, path);
    if (rc != code || !strstr(err_msg(), path) || (f1 && !strstr(err_msg(), f1)) || (f2 && !strstr(err_msg(), f2)))
        fail_msg("%s: rc %d (want %d), message \"%s\" (want \"%s\", \"%s\")", what, rc, code, err_msg(), f1 ? f1 : "",
                 f2 ? f2 : "");
    assert_null(g.tensors); // closed on error
}

static void test_corrupt(void **state) {
    (void)state;
    synth_t *s = malloc(sizeof *s);
    make_synth(s);
    gt_t t[NT], u[NT];
    synth_tensors(s, t);
    buf_t full = build(&SPEC0, t, NT);
    size_t full_n = full.n;
    free(full.b);
    gspec_t sp;

#define SPEC(field, value) (sp = SPEC0, sp.field = value, &sp)
    run_corrupt("bad magic", SPEC(magic, 0x46554748u), t, NT, ERR_INPUT, "not a GGUF file", NULL);
    run_corrupt("version 1", SPEC(version, 1), t, NT, ERR_UNSUP, "version 1", NULL);
    run_corrupt("big endian", SPEC(version, 0x03000000u), t, NT, ERR_UNSUP, "big-endian", NULL);
    run_corrupt("version 7", SPEC(version, 7), t, NT, ERR_INPUT, "unknown GGUF version 7", NULL);
    run_corrupt("empty", SPEC(truncate, 1), t, NT, ERR_INPUT, "truncated GGUF", "magic");
    run_corrupt("truncated header", SPEC(truncate, 450), t, NT, ERR_INPUT, "truncated GGUF", NULL);
    run_corrupt("truncated data", SPEC(truncate, full_n - 10), t, NT, ERR_INPUT, "tensor q5_k", "past the end");
    run_corrupt("absurd tensor count", SPEC(n_tensors, 1ll << 40), t, NT, ERR_INPUT, "more than the file can hold",
                NULL);
    run_corrupt("absurd kv count", SPEC(n_kv, 1ll << 62), t, NT, ERR_INPUT, "more than the file can hold", NULL);
    run_corrupt("string past end", SPEC(arch_len, 1ull << 40), t, NT, ERR_INPUT, "truncated GGUF",
                "general.architecture");
    run_corrupt("array past end", SPEC(arr_n, 1ull << 40), t, NT, ERR_INPUT, "test.i64", "past the end");
    run_corrupt("unknown value type", SPEC(kv_type, 99), t, NT, ERR_INPUT, "test.u8", "unknown metadata value type 99");
    run_corrupt("bad alignment", SPEC(alignment, 24), t, NT, ERR_INPUT, "general.alignment 24", NULL);

    // Tensor-level damage: copy the table, change one entry.
    memcpy(u, t, sizeof u);
    u[3].offset = 1u << 30;
    run_corrupt("offset past end", &SPEC0, u, NT, ERR_INPUT, "tensor q4_0", "past the end");
    memcpy(u, t, sizeof u);
    u[3].offset = 40; // the alignment is 32
    run_corrupt("misaligned offset", &SPEC0, u, NT, ERR_INPUT, "tensor q4_0", "not a multiple of the alignment 32");
    memcpy(u, t, sizeof u);
    u[1].offset = 0; // f16 on top of f32
    run_corrupt("overlap", &SPEC0, u, NT, ERR_INPUT, "overlap", "f16");
    memcpy(u, t, sizeof u);
    u[2].type = 99;
    run_corrupt("unknown type", &SPEC0, u, NT, ERR_UNSUP, "tensor bf16", "unknown ggml type 99");
    memcpy(u, t, sizeof u);
    u[3].ne[0] = 48;
    run_corrupt("row not whole blocks", &SPEC0, u, NT, ERR_INPUT, "tensor q4_0",
                "row length 48 is not a multiple of the block size 32");
    memcpy(u, t, sizeof u);
    u[0].nd = 5;
    run_corrupt("five dims", &SPEC0, u, NT, ERR_INPUT, "tensor f32", "5 dimensions");
    memcpy(u, t, sizeof u);
    u[0].ne[0] = 0;
    run_corrupt("zero dim", &SPEC0, u, NT, ERR_INPUT, "tensor f32", "dimension 0 is 0");
    memcpy(u, t, sizeof u);
    u[5].name = "f16";
    run_corrupt("duplicate name", &SPEC0, u, NT, ERR_INPUT, "duplicate tensor name f16", NULL);
    memcpy(u, t, sizeof u);
    u[0].name = "a_name_that_is_longer_than_the_sixty_four_bytes_gguf_allows_for_names";
    run_corrupt("long name", &SPEC0, u, NT, ERR_INPUT, "name length", NULL);
    memcpy(u, t, sizeof u);
    u[6].ne[0] = 1ull << 41;
    run_corrupt("huge dim", &SPEC0, u, NT, ERR_INPUT, "tensor q4_k", "dimension 0");
#undef SPEC

    // Every prefix of the file fails cleanly (never reads past what is there).
    synth_tensors(s, t);
    buf_t b = build(&SPEC0, t, NT);
    char path[600];
    snprintf(path, sizeof path, "%s/prefix.gguf", tu_tmpdir());
    for (size_t n = 0; n < b.n; n += n < 400 ? 1 : 97) {
        write_bytes(path, b.b, n);
        gguf_t g;
        if (gguf_open(&g, path) == 0) fail_msg("a %zu-byte prefix of a %zu-byte file opened", n, b.n);
    }
    free(b.b);
    free(s);
}

// ---- many names ------------------------------------------------------------------------

enum { DUP_NONE, DUP_KEY, DUP_TENSOR };

// A GGUF of n_kv uint32 keys "k.<i>" = i and n_t F32 tensors "t.<i>" of 8
// elements (32 bytes: each at the next aligned offset) holding i; with dup,
// the last key or tensor repeats the first one's name.
static const char *many_gguf(const char *name, int n_kv, int n_t, int dup) {
    buf_t b = {0};
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n_t);
    put_u64(&b, (uint64_t)n_kv);
    char s[32];
    for (int i = 0; i < n_kv; i++) {
        snprintf(s, sizeof s, "k.%d", dup == DUP_KEY && i == n_kv - 1 ? 0 : i);
        put_str(&b, s);
        put_u32(&b, GGUF_UINT32);
        put_u32(&b, (uint32_t)i);
    }
    for (int i = 0; i < n_t; i++) {
        snprintf(s, sizeof s, "t.%d", dup == DUP_TENSOR && i == n_t - 1 ? 0 : i);
        put_str(&b, s);
        put_u32(&b, 1);
        put_u64(&b, 8);
        put_u32(&b, GGML_F32);
        put_u64(&b, (uint64_t)i * 32);
    }
    while (b.n % 32)
        put(&b, "", 1);
    for (int i = 0; i < n_t; i++)
        for (int k = 0; k < 8; k++) {
            float v = (float)i;
            put(&b, &v, 4);
        }
    const char *path = write_file(name, &b);
    free(b.b);
    return path;
}

// 200K tensors and 50K metadata keys open, every name is found, and a
// duplicate at the far end of either table is found too. Duplicates used to
// be looked for pairwise (200K tensors: about 4 minutes to reject; 50K keys:
// 6-9 s), lookups by a linear scan. The watchdog turns a return to that into a
// failure rather than a hang; the speed itself is bench/bench_load.c's.
static void test_many_names(void **state) {
    (void)state;
    alarm(120);
    const int n_kv = 50000, n_t = 200000;
    const char *path = many_gguf("many.gguf", n_kv, n_t, DUP_NONE);
    gguf_t g;
    if (gguf_open(&g, path) < 0) fail_msg("%s", err_msg());
    assert_int_equal(g.n_tensors, n_t);
    assert_int_equal(g.n_kv, n_kv);
    char s[32];
    for (int i = 0; i < n_t; i++) {
        snprintf(s, sizeof s, "t.%d", i);
        const gguf_tensor_t *t = gguf_find_tensor(&g, s);
        if (t != &g.tensors[i]) fail_msg("tensor %s: found %s", s, t ? t->name : "nothing");
    }
    float x[8];
    assert_int_equal(gguf_read_tensor_f32(&g, gguf_find_tensor(&g, "t.123456"), x), 0);
    assert_true(x[0] == 123456.0f && x[7] == 123456.0f);
    for (int i = 0; i < n_kv; i++) {
        snprintf(s, sizeof s, "k.%d", i);
        int64_t v = -1;
        if (gguf_get_int(&g, s, &v) < 0 || v != i) fail_msg("key %s: %lld (%s)", s, (long long)v, err_msg());
    }
    assert_null(gguf_find_tensor(&g, "t.200000"));
    assert_null(gguf_find(&g, "k.-1"));
    assert_null(gguf_find(&g, ""));
    gguf_close(&g);

    path = many_gguf("many_dup_tensor.gguf", 10, n_t, DUP_TENSOR);
    err_clear();
    assert_int_equal(gguf_open(&g, path), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "duplicate tensor name t.0"));
    path = many_gguf("many_dup_key.gguf", n_kv, 10, DUP_KEY);
    err_clear();
    assert_int_equal(gguf_open(&g, path), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "duplicate metadata key k.0"));
    alarm(0);
}

// ---- llama q/k rows ---------------------------------------------------------------

// llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute (k_proj with n_head =
// n_kv_head):
//   w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
// Source w viewed as [n_head, 2, half, cols]; after swapaxes(1, 2) the result
// is [n_head, half, 2, cols] with out[h][i][j][c] = w[h][j][i][c], flattened
// row-major back to [rows, cols].
static void llamacpp_permute(const float *w, float *out, int64_t rows, int64_t cols, int64_t n_head) {
    int64_t half = rows / n_head / 2;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t j = 0; j < 2; j++)
                for (int64_t c = 0; c < cols; c++)
                    out[((h * half + i) * 2 + j) * cols + c] = w[((h * 2 + j) * half + i) * cols + c];
}

// One layer of a llama (or qwen3) GGUF whose attn_q / attn_k / attn_v hold
// the llama.cpp permutation of known HF matrices (v permuted too, with n_head:
// the loader must leave it alone); all three are read back via wsrc_read.
static void check_qk(const char *arch, int H, int Hkv, int dh) {
    int64_t d = (int64_t)H * dh, rq = (int64_t)H * dh, rk = (int64_t)Hkv * dh;
    float *wq = malloc((size_t)(rq * d) * sizeof(float)), *wk = malloc((size_t)(rk * d) * sizeof(float));
    float *pq = malloc((size_t)(rq * d) * sizeof(float)), *pk = malloc((size_t)(rk * d) * sizeof(float));
    float *out = malloc((size_t)(rq * d) * sizeof(float));
    assert_true(wq && wk && pq && pk && out);
    // Every element distinct and exact in fp32: row r, column c -> r * 1024 + c + 0.5.
    for (int64_t e = 0; e < rq * d; e++)
        wq[e] = (float)(e / d * 1024 + e % d) + 0.5f;
    for (int64_t e = 0; e < rk * d; e++)
        wk[e] = -(float)(e / d * 1024 + e % d) - 0.25f;
    llamacpp_permute(wq, pq, rq, d, H);
    llamacpp_permute(wk, pk, rk, d, Hkv);
    assert_true(memcmp(wq, pq, (size_t)(rq * d) * sizeof(float))); // the permutation moves rows

    char k[8][64];
    const char *suffix[8] = {"block_count",
                             "embedding_length",
                             "feed_forward_length",
                             "attention.head_count",
                             "attention.head_count_kv",
                             "vocab_size",
                             "context_length",
                             "attention.layer_norm_rms_epsilon"};
    const double val[8] = {1, (double)d, 64, H, Hkv, 16, 128, 1e-5};
    gkv_t kv[8];
    for (int i = 0; i < 8; i++) {
        snprintf(k[i], sizeof k[i], "%s.%s", arch, suffix[i]);
        kv[i] = (gkv_t){k[i], i == 7 ? GGUF_FLOAT32 : GGUF_UINT32, val[i], NULL};
    }
    gspec_t sp = SPEC0;
    sp.arch = arch, sp.extra = kv, sp.n_extra = 8;
    const gt_t t[3] = {
        {"blk.0.attn_q.weight", GGML_F32, 2, {(uint64_t)d, (uint64_t)rq}, pq, (size_t)(rq * d) * 4, -1},
        {"blk.0.attn_k.weight", GGML_F32, 2, {(uint64_t)d, (uint64_t)rk}, pk, (size_t)(rk * d) * 4, -1},
        {"blk.0.attn_v.weight", GGML_F32, 2, {(uint64_t)d, (uint64_t)rk}, pk, (size_t)(rk * d) * 4, -1},
    };
    buf_t b = build(&sp, t, 3);
    char name[64];
    snprintf(name, sizeof name, "qk_%s_%d_%d_%d.gguf", arch, H, Hkv, dh);
    const char *path = write_file(name, &b);
    free(b.b);

    arch_t a;
    wsrc_t *src;
    if (wsrc_open(&src, path, &a) < 0) fail_msg("%s", err_msg());
    assert_int_equal(a.H, H);
    assert_int_equal(a.Hkv, Hkv);
    assert_int_equal(a.dh, dh);
    int llama = !strcmp(arch, "llama");
    const struct {
        const char *hf;
        int64_t rows;
        const float *want;
    } c[3] = {
        {"model.layers.0.self_attn.q_proj.weight", rq, llama ? wq : pq},
        {"model.layers.0.self_attn.k_proj.weight", rk, llama ? wk : pk},
        {"model.layers.0.self_attn.v_proj.weight", rk, pk}, // never un-permuted
    };
    for (int i = 0; i < 3; i++) {
        int64_t shape[2] = {c[i].rows, d};
        if (wsrc_read(src, c[i].hf, shape, 2, out) < 0) fail_msg("%s", err_msg());
        for (int64_t e = 0; e < c[i].rows * d; e++)
            if (memcmp(&out[e], &c[i].want[e], 4))
                fail_msg("%s H %d Hkv %d dh %d: %s row %lld col %lld is %.9g, expected %.9g", arch, H, Hkv, dh, c[i].hf,
                         (long long)(e / d), (long long)(e % d), out[e], c[i].want[e]);
    }
    wsrc_close(src);
    free(wq), free(wk), free(pq), free(pk), free(out);
}

// A rope scaling factor of 0, NaN or -4, or an infinite / zero eps or rope
// base, is an error naming the file and the key, as on the config.json path
// (one check for both: arch_validate). They used to be accepted, and generate
// then printed nothing with exit 0.
static void test_bad_scalars(void **state) {
    (void)state;
    static const struct {
        const char *scaling; // rope.scaling.type, or NULL
        const char *key;     // the float key set to v
        double v;
        const char *f1, *f2;
    } c[] = {
        {"linear", "rope.scaling.factor", 0, "rope_scaling.factor = 0", "must be in (0, 65536]"},
        {"yarn", "rope.scaling.factor", NAN, "llama.rope.scaling.factor = nan", "not finite"},
        {"linear", "rope.scaling.factor", -4, "rope_scaling.factor = -4", "must be in (0, 65536]"},
        {"yarn", "rope.scaling.factor", INFINITY, "llama.rope.scaling.factor = inf", "not finite"},
        {NULL, "attention.layer_norm_rms_epsilon", INFINITY, "llama.attention.layer_norm_rms_epsilon = inf",
         "not finite"},
        {NULL, "attention.layer_norm_rms_epsilon", 0, "rms_norm_eps = 0", "must be in (0, 1]"},
        {NULL, "rope.freq_base", INFINITY, "llama.rope.freq_base = inf", "not finite"},
        {NULL, "rope.freq_base", -1, "rope_theta = -1", "must be in (0, 1e+12]"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        const char *suffix[7] = {"block_count",
                                 "embedding_length",
                                 "feed_forward_length",
                                 "attention.head_count",
                                 "vocab_size",
                                 "context_length",
                                 "attention.layer_norm_rms_epsilon"};
        const double val[7] = {1, 16, 32, 2, 10, 128, 1e-5};
        char k[9][80];
        gkv_t kv[9];
        int n = 0;
        for (int j = 0; j < 7; j++) {
            if (!strcmp(suffix[j], c[i].key)) continue;
            snprintf(k[n], sizeof k[n], "llama.%s", suffix[j]);
            kv[n] = (gkv_t){k[n], j == 6 ? GGUF_FLOAT32 : GGUF_UINT32, val[j], NULL};
            n++;
        }
        snprintf(k[n], sizeof k[n], "llama.%s", c[i].key);
        kv[n] = (gkv_t){k[n], GGUF_FLOAT32, c[i].v, NULL};
        n++;
        if (c[i].scaling) {
            snprintf(k[n], sizeof k[n], "llama.rope.scaling.type");
            kv[n] = (gkv_t){k[n], GGUF_STRING, 0, c[i].scaling};
            n++;
        }
        gspec_t sp = SPEC0;
        sp.extra = kv, sp.n_extra = n;
        buf_t b = build(&sp, NULL, 0);
        char name[64];
        snprintf(name, sizeof name, "scalar_%zu.gguf", i);
        const char *path = write_file(name, &b);
        free(b.b);
        gguf_t g;
        assert_int_equal(gguf_open(&g, path), 0);
        arch_t a;
        err_clear();
        int rc = gguf_arch(&g, &a);
        if (rc != ERR_INPUT || !strstr(err_msg(), path) || !strstr(err_msg(), c[i].f1) || !strstr(err_msg(), c[i].f2))
            fail_msg("case %zu: rc %d, message \"%s\" (want \"%s\", \"%s\")", i, rc, err_msg(), c[i].f1, c[i].f2);
        gguf_close(&g);
    }
}

static void test_llama_qk_unpermute(void **state) {
    (void)state;
    check_qk("llama", 2, 2, 4); // MHA, dh/2 = 2
    check_qk("llama", 4, 2, 8); // GQA, dh/2 = 4
    check_qk("llama", 3, 1, 6); // GQA (MQA), odd dh/2 = 3
    check_qk("llama", 6, 2, 4); // GQA 3:1
    check_qk("qwen3", 4, 2, 8); // qwen3 GGUFs are not permuted: rows as stored
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_header),        cmocka_unit_test(test_real_dequant),
        cmocka_unit_test(test_synthetic),          cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_llama_qk_unpermute), cmocka_unit_test(test_bad_scalars),
        cmocka_unit_test(test_many_names),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
