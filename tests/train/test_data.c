// The training data pipeline: `hylo data` inputs -> token shard -> loader rows.
//  - documents from .txt, .jsonl and .jsonl.zst (made here with libzstd) on the
//    real SmolLM2 tokenizer (HYLO_MODEL): ids against tok_encode_ex of the same
//    text, special tokens parsed only in rendered conversations, EOS after
//    every document, exact --assistant-only mask positions;
//  - malformed lines: the FILE:LINE message, skip vs --strict, no output left;
//  - shards: tok_hash (GGUF == exported HF files, pinned value), refusal of
//    another tokenizer's shard, truncated / corrupted / hostile headers;
//  - the loader on synthetic shards: rows are the stream's windows (across
//    shard boundaries, u16 and u32 ids, mask -> -1 targets), the per-epoch
//    shuffle (deterministic, a permutation, seed-dependent), rank slices
//    (disjoint, covering), seek / resume;
//  - the command line: summary, thread-count independence, --generate.
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "io/gguf.h"
#include "testutil.h"
#include "tok/tok.h"
#include "train/corpus.h"
#include "train/data.h"
#include "train/shard.h"

// ---------------------------------------------------------------------------
// Helpers

static tok_t g_tok;
static int g_tok_ok;

static const tok_t *smol(void) {
    if (!g_tok_ok) {
        const char *path = tu_model_path();
        gguf_t g;
        if (gguf_open(&g, path) < 0) fail_msg("gguf_open(%s): %s", path, err_msg());
        int rc = tok_load_gguf(&g_tok, &g);
        gguf_close(&g);
        if (rc < 0) fail_msg("tok_load_gguf: %s", err_msg());
        g_tok_ok = 1;
    }
    return &g_tok;
}

static void write_file(const char *path, const char *s, size_t n) { assert_int_equal(fs_write_all(path, s, n), 0); }

static void write_str(const char *path, const char *s) { write_file(path, s, strlen(s)); }

// A shard built from the inputs (space-separated names in tu_tmpdir()).
static void build(const char *out, const char *inputs, const data_build_cfg_t *cfg, data_build_stats_t *st) {
    char buf[2048], *v[32];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", inputs);
    static char paths[32][512];
    for (char *p = strtok(buf, " "); p; p = strtok(NULL, " ")) {
        snprintf(paths[n], sizeof paths[n], "%s/%s", tu_tmpdir(), p);
        v[n] = paths[n];
        n++;
    }
    data_build_cfg_t def = {0};
    data_build_stats_t s;
    if (data_build(out, smol(), (const char *const *)v, n, cfg ? cfg : &def, st ? st : &s) < 0)
        fail_msg("data_build(%s): %s", inputs, err_msg());
}

// The tokens, mask bits and document starts of a shard.
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    int64_t n;
    int64_t *docs;
    int64_t n_docs;
    uint64_t hash;
    int V;
} shard_dump_t;

static shard_dump_t dump(const char *path) {
    data_shard_t s;
    if (data_shard_open(&s, path) < 0) fail_msg("data_shard_open(%s): %s", path, err_msg());
    shard_dump_t d = {.n = s.n_tokens, .n_docs = s.n_docs, .hash = s.tok_hash, .V = s.n_vocab};
    d.ids = malloc((size_t)d.n * sizeof *d.ids);
    d.mask = malloc((size_t)d.n);
    d.docs = malloc((size_t)d.n_docs * sizeof *d.docs);
    for (int64_t i = 0; i < d.n; i++) {
        d.ids[i] = data_shard_token(&s, i);
        d.mask[i] = (uint8_t)data_shard_mask(&s, i);
    }
    for (int64_t i = 0; i < d.n_docs; i++)
        d.docs[i] = data_shard_doc_start(&s, i);
    data_shard_close(&s);
    return d;
}

static void dump_free(shard_dump_t *d) { free(d->ids), free(d->mask), free(d->docs); }

static int64_t doc_len(const shard_dump_t *d, int64_t i) {
    return (i + 1 < d->n_docs ? d->docs[i + 1] : d->n) - d->docs[i];
}

// ids of text (flags as tok_encode_ex) followed by EOS, against document i.
static void expect_doc(const shard_dump_t *d, int64_t i, const char *text, size_t len, int flags) {
    const tok_t *t = smol();
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode_ex(t, text, len, flags, &ids, &n), 0);
    assert_int_equal(doc_len(d, i), n + 1);
    assert_memory_equal(d->ids + d->docs[i], ids, (size_t)n * sizeof *ids);
    assert_int_equal(d->ids[d->docs[i] + n], t->eos);
    free(ids);
}

static char *slurp(const char *path, size_t *n) {
    char *s;
    assert_int_equal(fs_read_all(path, &s, n), 0);
    return s;
}

// ---------------------------------------------------------------------------
// Checksums and the tokenizer hash

static void test_crc32c(void **state) {
    // The CRC-32C check value (RFC 3720 B.4 and every CRC catalogue): "123456789" -> 0xE3069283.
    assert_int_equal(crc32c(0, "123456789", 9), 0xE3069283u);
    // 32 zero bytes -> 0x8A9136AA (RFC 3720 B.4).
    uint8_t z[32] = {0};
    assert_int_equal(crc32c(0, z, 32), 0x8A9136AAu);
    // Continuing over pieces (at odd offsets) gives the whole-buffer value.
    uint8_t b[1000];
    for (int i = 0; i < 1000; i++)
        b[i] = (uint8_t)(i * 7 + 3);
    uint32_t whole = crc32c(0, b, 1000), part = crc32c(crc32c(crc32c(0, b, 3), b + 3, 500), b + 503, 497);
    assert_int_equal(whole, part);
}

static void test_tok_hash(void **state) {
    const tok_t *t = smol();
    uint64_t h = tok_hash(t);
    // The exported Hugging Face files load into a tokenizer with the same hash,
    // so a checkpoint folder checks a shard made from the GGUF.
    char dir[600], a[700], b[700];
    snprintf(dir, sizeof dir, "%s/hf", tu_tmpdir());
    assert_int_equal(tok_write_hf(t, dir), 0);
    snprintf(a, sizeof a, "%s/tokenizer.json", dir);
    snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
    tok_t u;
    if (tok_load_json(&u, a, b) < 0) fail_msg("tok_load_json: %s", err_msg());
    assert_true(tok_hash(&u) == h);
    // The chat template is not part of it; the EOS id and one merge are.
    assert_int_equal(tok_set_chat_template(&u, NULL), 0);
    assert_true(tok_hash(&u) == h);
    int32_t eos = u.eos;
    u.eos = 0;
    assert_true(tok_hash(&u) != h);
    u.eos = eos;
    int32_t r = u.merge_r[100];
    u.merge_r[100] = u.merge_r[101];
    assert_true(tok_hash(&u) != h);
    u.merge_r[100] = r;
    assert_true(tok_hash(&u) == h);
    tok_free(&u);
    // Pinned: the value is part of every shard written so far; a change to the
    // serialisation (or to what the GGUF loader fills in) must be deliberate.
    printf("tok_hash(SmolLM2-135M-Instruct) = %016" PRIx64 "\n", h);
    assert_true(h == 0xa40a65096b4dbdc0ull);
}

// ---------------------------------------------------------------------------
// Documents

static void test_txt(void **state) {
    const char *text = "The first line.\n\nA second paragraph, with \"quotes\" and <|im_end|> in it.\n";
    write_str(tu_tmp_path("one.txt"), text);
    write_str(tu_tmp_path("two.txt"), "Just one line without a newline");
    build(tu_tmp_path("txt.shard"), "one.txt two.txt", NULL, NULL);
    shard_dump_t d = dump(tu_tmp_path("txt.shard"));
    assert_int_equal(d.n_docs, 2);
    assert_true(d.hash == tok_hash(smol()));
    assert_int_equal(d.V, smol()->n_vocab);
    // SmolLM2 adds no BOS; "<|im_end|>" in text stays text (no special parsing).
    expect_doc(&d, 0, text, strlen(text), 0);
    expect_doc(&d, 1, "Just one line without a newline", 31, 0);
    for (int64_t i = 0; i + 1 < d.n; i++)
        if (i != doc_len(&d, 0) - 1) assert_int_not_equal(d.ids[i], smol()->eos);
    for (int64_t i = 0; i < d.n; i++)
        assert_int_equal(d.mask[i], 1);
    dump_free(&d);

    // --split-lines: every line that is not blank, CRLF endings stripped.
    write_str(tu_tmp_path("lines.txt"), "alpha beta\r\n\ngamma\n   \ndelta");
    data_build_cfg_t cfg = {.split_lines = 1};
    build(tu_tmp_path("lines.shard"), "lines.txt", &cfg, NULL);
    d = dump(tu_tmp_path("lines.shard"));
    assert_int_equal(d.n_docs, 3);
    expect_doc(&d, 0, "alpha beta", 10, 0);
    expect_doc(&d, 1, "gamma", 5, 0);
    expect_doc(&d, 2, "delta", 5, 0); // the line of spaces is blank, like the empty one

    dump_free(&d);
}

static const char *g_jsonl = "{\"text\": \"Plain text, with <|im_start|> that must stay text.\"}\n"
                             "{\"text\": \"caf\\u00e9 \\ud83d\\ude00 emoji\", \"meta\": {\"id\": 3}}\n"
                             "\n"
                             "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, "
                             "{\"role\": \"assistant\", \"content\": \"2+2 is 4.\"}]}\n";

static void test_jsonl(void **state) {
    const tok_t *t = smol();
    write_str(tu_tmp_path("a.jsonl"), g_jsonl);
    data_build_stats_t st;
    build(tu_tmp_path("a.shard"), "a.jsonl", NULL, &st);
    assert_int_equal(st.docs, 3);
    assert_int_equal(st.skipped, 0);
    shard_dump_t d = dump(tu_tmp_path("a.shard"));
    assert_int_equal(d.n_docs, 3);
    assert_int_equal(st.tokens, d.n);
    assert_int_equal(st.loss_tokens, d.n);
    const char *t0 = "Plain text, with <|im_start|> that must stay text.";
    expect_doc(&d, 0, t0, strlen(t0), 0);
    for (int64_t i = 0; i < doc_len(&d, 0) - 1; i++)
        assert_false(tok_is_special(t, d.ids[i])); // user text never becomes control tokens
    const char *t1 = "caf\xc3\xa9 \xf0\x9f\x98\x80 emoji";
    expect_doc(&d, 1, t1, strlen(t1), 0);
    tok_msg_t m[2] = {{"user", "What is 2+2?"}, {"assistant", "2+2 is 4."}};
    char *r;
    assert_int_equal(tok_chat_render(t, m, 2, 0, &r), 0);
    expect_doc(&d, 2, r, strlen(r), TOK_SPECIAL); // the template's tokens are control tokens
    assert_true(tok_is_special(t, d.ids[d.docs[2]]));
    free(r);
    dump_free(&d);
}

// A .jsonl.zst of the same lines, in two zstd frames: the same shard body.
static void test_jsonl_zst(void **state) {
    size_t n = strlen(g_jsonl), half = 60;
    size_t cap = ZSTD_compressBound(n) * 2;
    char *z = malloc(cap);
    size_t a = ZSTD_compress(z, cap, g_jsonl, half, 3);
    assert_false(ZSTD_isError(a));
    size_t b = ZSTD_compress(z + a, cap - a, g_jsonl + half, n - half, 19);
    assert_false(ZSTD_isError(b));
    write_file(tu_tmp_path("z.jsonl.zst"), z, a + b);
    write_str(tu_tmp_path("p.jsonl"), g_jsonl);
    build(tu_tmp_path("z.shard"), "z.jsonl.zst", NULL, NULL);
    build(tu_tmp_path("p.shard"), "p.jsonl", NULL, NULL);
    size_t lz, lp;
    char *sz = slurp(tu_tmp_path("z.shard"), &lz), *sp = slurp(tu_tmp_path("p.shard"), &lp);
    assert_int_equal(lz, lp);
    assert_memory_equal(sz, sp, lz);
    free(sz), free(sp);

    // Cut inside the second frame: an error naming the file, no shard.
    write_file(tu_tmp_path("cut.jsonl.zst"), z, a + b - 5);
    const char *in[] = {tu_tmp_path("cut.jsonl.zst")};
    data_build_cfg_t cfg = {0};
    data_build_stats_t st;
    int rc = data_build(tu_tmp_path("cut.shard"), smol(), in, 1, &cfg, &st);
    assert_int_equal(rc, ERR_INPUT);
    printf("truncated zstd: %s\n", err_msg());
    assert_non_null(strstr(err_msg(), "cut.jsonl.zst"));
    assert_non_null(strstr(err_msg(), "truncated"));
    assert_false(fs_exists(tu_tmp_path("cut.shard")));
    // Not zstd at all.
    write_str(tu_tmp_path("bad.jsonl.zst"), "{\"text\": \"plain\"}\n");
    in[0] = tu_tmp_path("bad.jsonl.zst");
    assert_int_equal(data_build(tu_tmp_path("cut.shard"), smol(), in, 1, &cfg, &st), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "bad.jsonl.zst: zstd:"));
    free(z);
}

// Positions [a, b) of ids whose mask is 1, as a string like "5-9,12-14".
static void mask_ranges(const uint8_t *m, int64_t n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int64_t i = 0; i < n;) {
        if (!m[i]) {
            i++;
            continue;
        }
        int64_t j = i;
        while (j < n && m[j])
            j++;
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64 "-%" PRId64, k ? "," : "", i, j);
        i = j;
    }
}

// --assistant-only: 1 exactly on each assistant answer and the <|im_end|>
// closing it. The expected positions are found from the ids themselves: the
// answer starts after the ids of the header "<|im_start|>assistant\n" and ends
// with the next <|im_end|> (SmolLM2's EOS).
static void test_assistant_only(void **state) {
    const tok_t *t = smol();
    const char *line = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                       "{\"role\": \"user\", \"content\": \"Hi!\"}, "
                       "{\"role\": \"assistant\", \"content\": \"Hello, how can I help?\"}, "
                       "{\"role\": \"user\", \"content\": \"Name a colour.\"}, "
                       "{\"role\": \"assistant\", \"content\": \"\\nBlue.\"}]}";
    char why[512];
    data_doc_t d;
    assert_int_equal(data_doc_json(t, line, strlen(line), 1, &d, why, sizeof why), 0);
    data_doc_t all;
    assert_int_equal(data_doc_json(t, line, strlen(line), 0, &all, why, sizeof why), 0);
    assert_int_equal(all.n, d.n); // the mask changes nothing else
    assert_memory_equal(all.ids, d.ids, (size_t)d.n * sizeof *d.ids);
    assert_null(all.mask); // all in the loss
    assert_non_null(d.mask);
    int32_t im_end = tok_find(t, "<|im_end|>", 10), *hdr;
    int nh;
    assert_int_equal(tok_encode_ex(t, "<|im_start|>assistant\n", 22, TOK_SPECIAL, &hdr, &nh), 0);
    assert_true(im_end == t->eos && nh >= 3);
    uint8_t *want = calloc((size_t)d.n, 1);
    int answers = 0;
    for (int64_t i = 0; i + nh < d.n; i++) {
        if (memcmp(d.ids + i, hdr, (size_t)nh * sizeof *hdr)) continue;
        int64_t j = i + nh;
        while (d.ids[j] != im_end)
            j++;
        for (int64_t k = i + nh; k <= j; k++)
            want[k] = 1;
        answers++;
    }
    free(hdr);
    assert_int_equal(answers, 2);
    char got_r[256], want_r[256];
    mask_ranges(d.mask, d.n, got_r, sizeof got_r);
    mask_ranges(want, d.n, want_r, sizeof want_r);
    printf("assistant-only mask: %s (expected %s) of %" PRId64 " tokens\n", got_r, want_r, d.n);
    assert_string_equal(got_r, want_r);
    // What the masked tokens spell: the two answers with their <|im_end|>.
    int32_t sel[256];
    int ns = 0;
    for (int64_t i = 0; i < d.n; i++)
        if (d.mask[i]) sel[ns++] = d.ids[i];
    char *txt;
    size_t tl;
    assert_int_equal(tok_decode(t, sel, ns, 0, &txt, &tl), 0);
    assert_string_equal(txt, "Hello, how can I help?<|im_end|>\nBlue.<|im_end|>");
    free(txt);
    assert_int_equal(d.mask[d.n - 1], 0); // the EOS after the conversation
    free(want);
    data_doc_free(&d);
    data_doc_free(&all);

    // Text documents keep every token under --assistant-only.
    const char *tl1 = "{\"text\": \"not a chat\"}";
    assert_int_equal(data_doc_json(t, tl1, strlen(tl1), 1, &d, why, sizeof why), 0);
    assert_null(d.mask);
    data_doc_free(&d);
}

// The same on a Llama 3 template (which trims the content and closes a turn
// with <|eot_id|>): SmolLM2's vocabulary has none of its special tokens, so
// they are plain text here, and the mask must cover exactly the trimmed answer.
// (The answer ends in a letter: "." + "<|eot_id|>" as plain text would make one
// piece ".<|" straddling the answer's end, and a straddling token counts as
// the answer's; with a real Llama 3 vocabulary <|eot_id|> is one control token.)
static void test_assistant_only_llama3(void **state) {
    char p[600], c[600];
    snprintf(p, sizeof p, "%s/hf/tokenizer.json", tu_tmpdir());
    snprintf(c, sizeof c, "%s/hf/tokenizer_config.json", tu_tmpdir());
    if (!fs_exists(p)) assert_int_equal(tok_write_hf(smol(), tu_tmp_path("hf")), 0);
    tok_t u;
    if (tok_load_json(&u, p, c) < 0) fail_msg("tok_load_json: %s", err_msg());
    assert_int_equal(tok_set_chat_template(&u, "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
                                               "m['content'] | trim + '<|eot_id|>' }}"),
                     0);
    assert_int_equal(u.chat, TOK_CHAT_LLAMA3);
    const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, "
                       "{\"role\": \"assistant\", \"content\": \"  Fine, thanks  \"}]}";
    char why[512];
    data_doc_t d;
    assert_int_equal(data_doc_json(&u, line, strlen(line), 1, &d, why, sizeof why), 0);
    int32_t sel[256];
    int ns = 0;
    for (int64_t i = 0; i < d.n; i++)
        if (d.mask[i]) sel[ns++] = d.ids[i];
    char *txt;
    size_t tl;
    assert_int_equal(tok_decode(&u, sel, ns, 0, &txt, &tl), 0);
    printf("llama3 answer tokens: \"%s\"\n", txt);
    assert_string_equal(txt, "Fine, thanks");
    free(txt);
    data_doc_free(&d);
    tok_free(&u);
}

// Each malformed line: data_doc_json says 1 and why.
static void test_malformed_lines(void **state) {
    const tok_t *t = smol();
    static const struct {
        const char *line, *why;
    } cases[] = {
        {"not json", "bad JSON"},
        {"{\"text\": \"unterminated}", "bad JSON"},
        {"{\"text\": \"a\"} trailing", "text after the value"},
        {"[1, 2]", "not a JSON object"},
        {"{\"foo\": 1}", "no \"text\" or \"messages\""},
        {"{\"text\": 5}", "\"text\" is not a string"},
        {"{\"text\": \"\"}", "\"text\" is empty"},
        {"{\"text\": \"x\", \"messages\": []}", "both \"text\" and \"messages\""},
        {"{\"text\": \"bad \xff byte\"}", "not valid UTF-8"},
        {"{\"text\": \"lone \\udc00 surrogate\"}", "bad JSON"},
        {"{\"text\": \"nul \\u0000 inside\"}", "\\u0000"},
        {"{\"messages\": {}}", "\"messages\" is not an array"},
        {"{\"messages\": []}", "\"messages\" is empty"},
        {"{\"messages\": [3]}", "messages[0] is not an object"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0].role is missing"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"user\"}]}",
         "messages[1].content is missing"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [\"parts\"]}]}", "messages[0].content is not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}", "messages[0].content is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[512] = "";
        data_doc_t d;
        int rc = data_doc_json(t, cases[i].line, strlen(cases[i].line), 0, &d, why, sizeof why);
        printf("  %-60s -> %d: %s\n", cases[i].line, rc, why);
        assert_int_equal(rc, 1);
        assert_non_null(strstr(why, cases[i].why));
        assert_null(d.ids);
    }
}

// The file:line report, skip vs --strict, through the command line.
static void test_malformed_cli(void **state) {
    write_str(tu_tmp_path("bad.jsonl"), "{\"text\": \"good one\"}\n"
                                        "{\"text\": 5}\n"
                                        "\n"
                                        "oops\n"
                                        "{\"text\": \"good two\"}\n");
    write_str(tu_tmp_path("bad.txt"), "fine line\nbad \xc0\xaf here\n");
    char args[2048];
    char *err;
    snprintf(args, sizeof args, "data --tokenizer %s --out %s %s %s", tu_model_path(), tu_tmp_path("skip.shard"),
             tu_tmp_path("bad.jsonl"), tu_tmp_path("bad.txt"));
    assert_int_equal(tu_run_hylo(args, &err), 0);
    char want[700];
    snprintf(want, sizeof want, "%s:2: \"text\" is not a string (skipped)", tu_tmp_path("bad.jsonl"));
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof want, "%s:4: bad JSON", tu_tmp_path("bad.jsonl"));
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof want, "%s:2: invalid UTF-8 (byte 0xc0 at column 5) (skipped)", tu_tmp_path("bad.txt"));
    assert_non_null(strstr(err, want));
    free(err);
    shard_dump_t d = dump(tu_tmp_path("skip.shard"));
    assert_int_equal(d.n_docs, 2);
    expect_doc(&d, 0, "good one", 8, 0);
    expect_doc(&d, 1, "good two", 8, 0);
    dump_free(&d);
    // The summary on stdout counts the skipped lines.
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    char *out = slurp(tu_tmp_path("out.txt"), NULL);
    assert_non_null(strstr(out, "2 documents from 2 files"));
    assert_non_null(strstr(out, "3 lines skipped"));
    free(out);

    // --strict: the first bad line is the error (exit 2), nothing is written.
    snprintf(args, sizeof args, "data --strict --tokenizer %s --out %s %s", tu_model_path(),
             tu_tmp_path("strict.shard"), tu_tmp_path("bad.jsonl"));
    assert_int_equal(tu_run_hylo(args, &err), 2);
    snprintf(want, sizeof want, "hylo: error: %s:2: \"text\" is not a string\n", tu_tmp_path("bad.jsonl"));
    assert_string_equal(err, want);
    free(err);
    assert_false(fs_exists(tu_tmp_path("strict.shard")));
    DIR *dir = opendir(tu_tmpdir());
    struct dirent *de;
    while ((de = readdir(dir)))
        assert_null(strstr(de->d_name, ".tmp.")); // no temporary left behind
    closedir(dir);
}

// Folders: every input file under them, sorted by path; other files ignored.
static void test_folder_inputs(void **state) {
    char d1[600], d2[700];
    snprintf(d1, sizeof d1, "%s/corpus", tu_tmpdir());
    snprintf(d2, sizeof d2, "%s/b_sub", d1);
    assert_int_equal(fs_mkdir_p(d2), 0);
    char p[800];
    snprintf(p, sizeof p, "%s/c.txt", d1);
    write_str(p, "third");
    snprintf(p, sizeof p, "%s/a.jsonl", d1);
    write_str(p, "{\"text\": \"first\"}\n");
    snprintf(p, sizeof p, "%s/x.txt", d2);
    write_str(p, "second");
    snprintf(p, sizeof p, "%s/notes.md", d1);
    write_str(p, "ignored");
    build(tu_tmp_path("dir.shard"), "corpus", NULL, NULL);
    shard_dump_t d = dump(tu_tmp_path("dir.shard"));
    assert_int_equal(d.n_docs, 3);
    expect_doc(&d, 0, "first", 5, 0);
    expect_doc(&d, 1, "second", 6, 0);
    expect_doc(&d, 2, "third", 5, 0);
    dump_free(&d);
    // A file named explicitly must be an input type.
    const char *in[] = {p};
    data_build_cfg_t cfg = {0};
    data_build_stats_t st;
    assert_int_equal(data_build(tu_tmp_path("md.shard"), smol(), in, 1, &cfg, &st), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "notes.md"));
}

// The shard does not depend on the thread count (documents in input order).
static void test_threads_deterministic(void **state) {
    char big[1 << 16];
    size_t k = 0;
    for (int i = 0; i < 400; i++)
        k += (size_t)snprintf(big + k, sizeof big - k, "{\"text\": \"document %d: %.*s\"}\n", i, 40 + i % 57,
                              "the quick brown fox jumps over the lazy dog and keeps running far away");
    write_file(tu_tmp_path("many.jsonl"), big, k);
    data_build_cfg_t c1 = {.threads = 1}, c2 = {.threads = 2}, c3 = {.threads = 7};
    build(tu_tmp_path("t1.shard"), "many.jsonl", &c1, NULL);
    build(tu_tmp_path("t2.shard"), "many.jsonl", &c2, NULL);
    build(tu_tmp_path("t7.shard"), "many.jsonl", &c3, NULL);
    size_t n1, n2, n7;
    char *a = slurp(tu_tmp_path("t1.shard"), &n1), *b = slurp(tu_tmp_path("t2.shard"), &n2),
         *c = slurp(tu_tmp_path("t7.shard"), &n7);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, n7);
    assert_memory_equal(a, b, n1);
    assert_memory_equal(a, c, n1);
    free(a), free(b), free(c);
    shard_dump_t d = dump(tu_tmp_path("t2.shard"));
    assert_int_equal(d.n_docs, 400);
    char want[256];
    snprintf(want, sizeof want, "document 399: %.*s", 40 + 399 % 57,
             "the quick brown fox jumps over the lazy dog and keeps running far away");
    expect_doc(&d, 399, want, strlen(want), 0);
    dump_free(&d);
}

// The 49 essays, one document per file (when ../shared/data is present).
static void test_essays(void **state) {
    const char *dir = getenv("HYLO_ESSAYS") ? getenv("HYLO_ESSAYS") : "../shared/data/essays";
    if (!fs_is_dir(dir)) {
        printf("essays not found at %s\n", dir);
        skip();
    }
    const char *in[] = {dir};
    data_build_cfg_t cfg = {0};
    data_build_stats_t st;
    if (data_build(tu_tmp_path("essays.shard"), smol(), in, 1, &cfg, &st) < 0) fail_msg("%s", err_msg());
    char **files;
    int nf;
    assert_int_equal(data_list_inputs(in, 1, &files, &nf), 0);
    assert_int_equal(st.files, nf);
    shard_dump_t d = dump(tu_tmp_path("essays.shard"));
    assert_int_equal(d.n_docs, nf);
    for (int i = 0; i < nf; i++) {
        if (i) assert_true(strcmp(files[i - 1], files[i]) < 0);
        size_t n;
        char *s = slurp(files[i], &n);
        expect_doc(&d, i, s, n, 0);
        free(s);
    }
    printf("essays: %d documents, %" PRId64 " tokens\n", nf, d.n);
    dump_free(&d);
    data_free_list(files, nf);
}

// ---------------------------------------------------------------------------
// Shards: refusal of another tokenizer, truncation, corruption, hostile headers

// A small valid shard of SmolLM2 ids (its path in a buffer of its own: the
// tu_tmp_path ones rotate).
static const char *small_shard(void) {
    static char p[600];
    snprintf(p, sizeof p, "%s/small.shard", tu_tmpdir());
    write_str(tu_tmp_path("small.jsonl"), "{\"text\": \"one two three four five six seven\"}\n"
                                          "{\"text\": \"eight nine ten\"}\n");
    build(p, "small.jsonl", NULL, NULL);
    tu_corpus_save(p);
    return p;
}

static void expect_refused(const char *path, const char *w1, const char *w2) {
    data_loader_t *dl = NULL;
    int rc = data_loader_open(&dl, path, NULL, 4, 1, 0, 1);
    printf("  refused: %s\n", err_msg());
    assert_true(rc == ERR_INPUT || rc == ERR_UNSUP);
    assert_null(dl);
    assert_non_null(strstr(err_msg(), path));
    assert_non_null(strstr(err_msg(), w1));
    if (w2) assert_non_null(strstr(err_msg(), w2));
}

// A copy of src with bytes patched (n bytes at off), truncated to len (-1: as is),
// and, when fix, both CRCs recomputed so only the field checks can catch it.
static const char *patched(const char *src, const char *name, long len, size_t off, const void *bytes, size_t n,
                           int fix) {
    size_t sz;
    char *s = slurp(src, &sz);
    if (bytes) memcpy(s + off, bytes, n);
    if (len >= 0) sz = (size_t)len;
    if (fix) {
        uint32_t pc = crc32c(0, s + 64, sz - 64);
        memcpy(s + 52, &pc, 4);
        uint32_t hc = crc32c(0, s, 60);
        memcpy(s + 60, &hc, 4);
    }
    const char *p = tu_tmp_path(name);
    write_file(p, s, sz);
    free(s);
    tu_corpus_save(p); // a seed for fuzz/fuzz_shard.c (HYLO_CORPUS_OUT)
    return p;
}

static void test_shard_refusals(void **state) {
    const char *good = small_shard();
    const tok_t *t = smol();
    data_loader_t *dl;
    assert_int_equal(data_loader_open(&dl, good, t, 4, 1, 0, 1), 0);
    data_loader_close(dl);

    // Another tokenizer: the hash in the header differs (CRC fixed, so it is
    // the tokenizer check that refuses it).
    uint64_t other = tok_hash(t) ^ 0x5a5a;
    const char *p = patched(good, "other.shard", -1, 16, &other, 8, 1);
    assert_int_equal(data_loader_open(&dl, p, NULL, 4, 1, 0, 1), 0); // no tokenizer: no check
    data_loader_close(dl);
    assert_int_equal(data_loader_open(&dl, p, t, 4, 1, 0, 1), ERR_INPUT);
    char h1[32], h2[32];
    snprintf(h1, sizeof h1, "%016" PRIx64, other);
    snprintf(h2, sizeof h2, "%016" PRIx64, tok_hash(t));
    printf("  other tokenizer: %s\n", err_msg());
    assert_non_null(strstr(err_msg(), p));
    assert_non_null(strstr(err_msg(), h1));
    assert_non_null(strstr(err_msg(), h2));
    // A shard written for a different vocabulary size.
    uint32_t v = (uint32_t)t->n_vocab + 1;
    p = patched(good, "vocab.shard", -1, 24, &v, 4, 1);
    assert_int_equal(data_loader_open(&dl, p, t, 4, 1, 0, 1), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "vocabulary"));

    size_t sz;
    free(slurp(good, &sz));
    expect_refused(patched(good, "trunc1.shard", (long)sz - 1, 0, NULL, 0, 0), "truncated", NULL);
    expect_refused(patched(good, "trunc2.shard", 40, 0, NULL, 0, 0), "shorter than the 64-byte", NULL);
    expect_refused(patched(good, "empty.shard", 0, 0, NULL, 0, 0), "shorter than the 64-byte", NULL);
    expect_refused(patched(good, "magic.shard", -1, 0, "GGUF", 4, 0), "not a hylo token shard", NULL);
    uint8_t x = 0xff;
    expect_refused(patched(good, "flip.shard", -1, 64 + 3, &x, 1, 0), "payload CRC-32C", "corrupted");
    expect_refused(patched(good, "hflip.shard", -1, 33, &x, 1, 0), "header CRC-32C", "corrupted");
    uint32_t ver = 2;
    expect_refused(patched(good, "ver.shard", -1, 8, &ver, 4, 1), "version 2", NULL);
    // Hostile counts, with valid CRCs: checked against the file size before use.
    uint64_t huge = (uint64_t)1 << 62;
    expect_refused(patched(good, "ntok.shard", -1, 32, &huge, 8, 1), "tokens of 2 bytes do not fit", NULL);
    expect_refused(patched(good, "ndoc.shard", -1, 40, &huge, 8, 1), "documents do not fit", NULL);
    uint64_t one = 1;
    expect_refused(patched(good, "nt1.shard", -1, 32, &one, 8, 1), "the header describes", NULL);
    uint32_t tb = 4;
    expect_refused(patched(good, "tb.shard", -1, 28, &tb, 4, 1), "bytes per token", NULL);
    // An id past the vocabulary and a broken document index (CRCs fixed).
    uint16_t bad = 65000;
    expect_refused(patched(good, "id.shard", -1, 64 + 2, &bad, 2, 1), "outside the vocabulary", NULL);
    uint64_t dstart = 3; // document 0 must start at 0
    expect_refused(patched(good, "doc.shard", -1, sz - 16, &dstart, 8, 1), "document 0 starts at token 3", NULL);
    // Trailing bytes.
    char *s = slurp(good, &sz);
    s = realloc(s, sz + 8);
    memset(s + sz, 0, 8);
    write_file(tu_tmp_path("trail.shard"), s, sz + 8);
    free(s);
    expect_refused(tu_tmp_path("trail.shard"), "trailing bytes", NULL);
}

// ---------------------------------------------------------------------------
// The loader on synthetic shards

// A shard of the ids base .. base + n - 1 (mod V) in documents of doc_len
// tokens; token i's mask bit is (i % 5 != 3).
static void synth_shard(const char *path, int64_t base, int64_t n, int V, int doc_len, uint64_t hash) {
    data_shard_writer_t *w;
    assert_int_equal(data_shard_create(&w, path, hash, V), 0);
    int32_t *ids = malloc((size_t)doc_len * sizeof *ids);
    uint8_t *m = malloc((size_t)doc_len);
    for (int64_t i = 0; i < n; i += doc_len) {
        int k = (int)(n - i < doc_len ? n - i : doc_len);
        for (int j = 0; j < k; j++) {
            ids[j] = (int32_t)((base + i + j) % V);
            m[j] = (base + i + j) % 5 != 3;
        }
        assert_int_equal(data_shard_add(w, ids, m, k), 0);
    }
    assert_int_equal(data_shard_finish(w), 0);
    free(ids), free(m);
    tu_corpus_save(path); // the small ones seed fuzz/fuzz_shard.c (u16 and u32 ids)
}

// Rows are windows of T+1 tokens at stride T of the concatenated shards
// (crossing from one shard into the next), targets -1 where the mask is 0.
static void check_windows(int V, int T) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/synth%d_%d", tu_tmpdir(), V, T);
    assert_int_equal(fs_mkdir_p(dir), 0);
    char p[700];
    // Three shards of 1000, 37 and 2500 tokens: 3537 in all (names sort in stream order).
    int64_t sizes[3] = {1000, 37, 2500}, base = 0;
    for (int s = 0; s < 3; s++) {
        snprintf(p, sizeof p, "%s/part-%d.shard", dir, s);
        synth_shard(p, base, sizes[s], V, 13 + s, 77);
        base += sizes[s];
    }
    snprintf(p, sizeof p, "%s/notes.txt", dir); // not a shard: ignored
    write_str(p, "x");
    data_loader_t *dl;
    assert_int_equal(data_loader_open(&dl, dir, NULL, T, 5, 0, 1), 0);
    int64_t N = 3537, R = (N - 1) / T;
    assert_int_equal(data_loader_tokens(dl), N);
    assert_int_equal(data_loader_rows(dl), R);
    int32_t *ids = malloc((size_t)T * sizeof *ids), *tg = malloc((size_t)T * sizeof *tg);
    uint8_t *seen = calloc((size_t)R, 1);
    for (int64_t i = 0; i < R; i++) {
        assert_int_equal(data_loader_next(dl, ids, tg), 0);
        int64_t r = ids[0] / T; // ids are stream positions (V > N)
        assert_true(r >= 0 && r < R && !seen[r]);
        seen[r] = 1;
        for (int t = 0; t < T; t++) {
            int64_t g = r * T + t;
            assert_int_equal(ids[t], g);
            assert_int_equal(tg[t], (g + 1) % 5 != 3 ? g + 1 : -1);
        }
    }
    assert_int_equal(data_loader_pos(dl).epoch, 1); // the epoch wrapped after its last row
    assert_int_equal(data_loader_pos(dl).index, 0);
    free(ids), free(tg), free(seen);
    data_loader_close(dl);
}

static void test_loader_windows(void **state) {
    check_windows(65536, 64); // u16 ids
    check_windows(100000, 7); // u32 ids
    check_windows(70000, 1);  // T = 1: every token but the first is a target once
}

static void test_loader_too_small(void **state) {
    const char *p = tu_tmp_path("tiny.shard");
    synth_shard(p, 0, 10, 100, 10, 1);
    data_loader_t *dl;
    assert_int_equal(data_loader_open(&dl, p, NULL, 9, 1, 0, 1), 0); // 10 tokens: one row of 9+1
    assert_int_equal(data_loader_rows(dl), 1);
    data_loader_close(dl);
    assert_int_equal(data_loader_open(&dl, p, NULL, 10, 1, 0, 1), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "0 rows of 10+1 tokens"));
    assert_int_equal(data_loader_open(&dl, p, NULL, 4, 1, 0, 3), ERR_INPUT); // 2 rows, 3 ranks
    assert_int_equal(data_loader_open(&dl, p, NULL, 4, 1, 3, 3), ERR_INPUT); // rank out of range
}

// The global rows of one epoch of a loader, in the order it hands them out.
static void epoch_rows(data_loader_t *dl, int T, int64_t *out) {
    int32_t ids[64], tg[64];
    assert_true(T <= 64);
    for (int64_t i = 0; i < data_loader_rows(dl); i++) {
        assert_int_equal(data_loader_next(dl, ids, tg), 0);
        out[i] = ids[0] / T;
    }
}

// A mixture: rows never cross sources; a source of fraction f gives
// round(f R) of its R rows to every epoch: f < 1 the same subset each epoch,
// f > 1 every row floor(f) or ceil(f) times; the epoch shuffles the shares
// together; a bad fraction is an error naming it.
static void test_loader_mix(void **state) {
    const int T = 8, V = 65536;
    const char *pa = tu_tmp_path("mixa.shard"), *pb = tu_tmp_path("mixb.shard");
    synth_shard(pa, 0, 8 * 300 + 1, V, 50, 1);     // 300 rows, ids 0 ..
    synth_shard(pb, 30000, 8 * 120 + 1, V, 40, 1); // 120 rows, ids 30000 ..
    for (int c = 0; c < 2; c++) {
        double fb = c ? 2.5 : 0.5;
        int64_t share = c ? 300 : 60; // round(fb x 120)
        data_source_t src[2] = {{pa, 1.0}, {pb, fb}};
        data_loader_t *dl;
        assert_int_equal(data_loader_open_mix(&dl, src, 2, NULL, T, 3, 0, 1), 0);
        int64_t R = data_loader_rows(dl);
        assert_int_equal(R, 300 + share);
        int count_b[2][120] = {{0}};
        int seen_a[300] = {0}, from_a = 0, first_b = -1;
        int32_t ids[8], tg[8];
        for (int e = 0; e < 2; e++) {
            for (int64_t i = 0; i < R; i++) {
                assert_int_equal(data_loader_next(dl, ids, tg), 0);
                int b = ids[0] >= 30000;
                int64_t r = (ids[0] - (b ? 30000 : 0)) / T;
                for (int t = 0; t < T; t++) // the window lies in one source
                    assert_int_equal(ids[t], (b ? 30000 : 0) + r * T + t);
                if (b) {
                    count_b[e][r]++;
                    if (first_b < 0) first_b = (int)i;
                } else if (e == 0) {
                    assert_int_equal(seen_a[r]++, 0), from_a++;
                }
            }
        }
        assert_int_equal(from_a, 300);
        assert_true(first_b < 100); // shuffled together, not A then B
        int64_t total = 0;
        for (int r = 0; r < 120; r++) {
            total += count_b[0][r];
            assert_int_equal(count_b[0][r], count_b[1][r]); // the same share every epoch
            if (c == 0) assert_true(count_b[0][r] <= 1);
            if (c == 1) assert_true(count_b[0][r] == 2 || count_b[0][r] == 3);
        }
        assert_int_equal(total, share);
        data_loader_close(dl);
    }
    data_source_t bad[2] = {{pa, 1.0}, {pb, 0.001}}; // 0.12 rows
    data_loader_t *dl;
    assert_int_equal(data_loader_open_mix(&dl, bad, 2, NULL, T, 3, 0, 1), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "mixb.shard"));
    bad[1].weight = -1;
    assert_int_equal(data_loader_open_mix(&dl, bad, 2, NULL, T, 3, 0, 1), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "fraction -1"));
}

static void test_loader_shuffle(void **state) {
    const char *p = tu_tmp_path("shuf.shard");
    const int T = 16;
    synth_shard(p, 0, 16 * 1000 + 1, 65536, 100, 1); // exactly 1000 rows
    data_loader_t *a, *b, *c;
    assert_int_equal(data_loader_open(&a, p, NULL, T, 42, 0, 1), 0);
    assert_int_equal(data_loader_open(&b, p, NULL, T, 42, 0, 1), 0);
    assert_int_equal(data_loader_open(&c, p, NULL, T, 43, 0, 1), 0);
    int64_t R = data_loader_rows(a);
    assert_int_equal(R, 1000);
    int64_t *ra = malloc(2 * R * sizeof *ra), *rb = malloc(2 * R * sizeof *rb), *rc = malloc(R * sizeof *rc);
    epoch_rows(a, T, ra);
    epoch_rows(a, T, ra + R);
    epoch_rows(b, T, rb);
    epoch_rows(b, T, rb + R);
    epoch_rows(c, T, rc);
    assert_memory_equal(ra, rb, 2 * R * sizeof *ra); // same seed: same order, both epochs
    // Each epoch is a permutation, not the identity, and differs from the other
    // epoch and from another seed's. (Two independent permutations of 1000
    // agree in about 1 place on average; 50 would be a broken shuffle.)
    for (int e = 0; e < 2; e++) {
        uint8_t *seen = calloc((size_t)R, 1);
        int fixed = 0;
        for (int64_t i = 0; i < R; i++) {
            int64_t r = ra[e * R + i];
            assert_true(r >= 0 && r < R && !seen[r]);
            seen[r] = 1;
            fixed += r == i;
        }
        free(seen);
        assert_true(fixed < 50);
    }
    int same_epoch = 0, same_seed = 0;
    for (int64_t i = 0; i < R; i++) {
        same_epoch += ra[i] == ra[R + i];
        same_seed += ra[i] == rc[i];
    }
    printf("positions equal: epoch 0 vs 1 %d, seed 42 vs 43 %d (of %" PRId64 ")\n", same_epoch, same_seed, R);
    assert_true(same_epoch < 50);
    assert_true(same_seed < 50);
    // The order is a function of (seed, epoch) only: pinned first rows, so a
    // change of the permutation (which would change every resumed run) is seen.
    printf("seed 42 epoch 0 starts %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "\n", ra[0], ra[1], ra[2], ra[3]);
    const int64_t first[4] = {966, 56, 665, 284};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ra[i], first[i]);
        assert_int_equal(data_loader_row_at(a, 0, i), ra[i]);
    }
    free(ra), free(rb), free(rc);
    data_loader_close(a), data_loader_close(b), data_loader_close(c);
    // Tiny corpora (1, 2, 3 rows) still permute.
    for (int rows = 1; rows <= 3; rows++) {
        synth_shard(p, 0, 4 * rows + 1, 100, 7, 1);
        data_loader_t *dl;
        assert_int_equal(data_loader_open(&dl, p, NULL, 4, 9, 0, 1), 0);
        int64_t got[3];
        int seen = 0;
        for (int e = 0; e < 3; e++) {
            epoch_rows(dl, 4, got);
            for (int i = 0; i < rows; i++)
                seen |= 1 << got[i];
            assert_int_equal(seen, (1 << rows) - 1);
        }
        data_loader_close(dl);
    }
}

// Ranks: disjoint slices of each epoch's order; together all rows when the
// rank count divides them, else all but rows % world; equal counts per rank.
static void test_loader_ranks(void **state) {
    const char *p = tu_tmp_path("ranks.shard");
    const int T = 8;
    for (int total = 600; total <= 601; total++) {
        synth_shard(p, 0, (int64_t)T * total + 1, 65536, 50, 1);
        for (int world = 1; world <= 4; world++) {
            uint8_t *owner = calloc((size_t)total, 1);
            int64_t covered = 0;
            for (int rank = 0; rank < world; rank++) {
                data_loader_t *dl;
                assert_int_equal(data_loader_open(&dl, p, NULL, T, 7, rank, world), 0);
                assert_int_equal(data_loader_rows(dl), total / world);
                int64_t *r = malloc((size_t)total * sizeof *r);
                epoch_rows(dl, T, r);
                for (int64_t i = 0; i < data_loader_rows(dl); i++) {
                    assert_int_equal(owner[r[i]], 0); // disjoint
                    owner[r[i]] = (uint8_t)(rank + 1);
                    covered++;
                    // position i * world + rank of the shared order
                    assert_int_equal(data_loader_row_at(dl, 0, i * world + rank), r[i]);
                }
                free(r);
                data_loader_close(dl);
            }
            assert_int_equal(covered, total - total % world);
            free(owner);
        }
    }
}

// seek(pos()) on a fresh loader gives the same rows, within and across epochs.
static void test_loader_seek(void **state) {
    const char *p = tu_tmp_path("seek.shard");
    const int T = 8;
    synth_shard(p, 0, 8 * 100 + 5, 65536, 30, 1); // 100 rows
    for (int world = 1; world <= 2; world++) {
        data_loader_t *a;
        assert_int_equal(data_loader_open(&a, p, NULL, T, 11, world - 1, world), 0);
        int64_t R = data_loader_rows(a);
        int32_t ids[8], tg[8], ids2[8], tg2[8];
        for (int64_t skip = 0; skip < 3 * R; skip += 37) {
            data_loader_t *x, *y;
            assert_int_equal(data_loader_open(&x, p, NULL, T, 11, world - 1, world), 0);
            for (int64_t i = 0; i < skip; i++)
                assert_int_equal(data_loader_next(x, ids, tg), 0);
            data_pos_t pos = data_loader_pos(x);
            assert_int_equal(pos.epoch, skip / R);
            assert_int_equal(pos.index, skip % R);
            assert_int_equal(data_loader_open(&y, p, NULL, T, 11, world - 1, world), 0);
            assert_int_equal(data_loader_seek(y, pos), 0);
            for (int64_t i = 0; i < R + 5; i++) { // past the next epoch boundary
                assert_int_equal(data_loader_next(x, ids, tg), 0);
                assert_int_equal(data_loader_next(y, ids2, tg2), 0);
                assert_memory_equal(ids, ids2, sizeof ids);
                assert_memory_equal(tg, tg2, sizeof tg);
            }
            data_loader_close(x), data_loader_close(y);
        }
        data_pos_t bad = {0, R};
        assert_int_equal(data_loader_seek(a, bad), ERR_INPUT);
        bad = (data_pos_t){-1, 0};
        assert_int_equal(data_loader_seek(a, bad), ERR_INPUT);
        data_loader_close(a);
    }
}

// ---------------------------------------------------------------------------
// The command line

static void test_cli(void **state) {
    char *err;
    assert_int_equal(tu_run_hylo("data --help", NULL), 0);
    assert_int_equal(tu_run_hylo("data --out x.shard in.txt", &err), 2);
    assert_non_null(strstr(err, "--tokenizer"));
    free(err);
    char args[1600];
    snprintf(args, sizeof args, "data --tokenizer %s --out %s", tu_model_path(), tu_tmp_path("n.shard"));
    assert_int_equal(tu_run_hylo(args, &err), 2);
    assert_non_null(strstr(err, "missing INPUT"));
    free(err);
    snprintf(args, sizeof args, "data --tokenizer %s --out %s /nonexistent.jsonl", tu_model_path(),
             tu_tmp_path("n.shard"));
    assert_int_equal(tu_run_hylo(args, &err), 2);
    assert_non_null(strstr(err, "/nonexistent.jsonl"));
    free(err);
    // A checkpoint folder's tokenizer (the exported HF files) gives the same shard as the GGUF's.
    write_str(tu_tmp_path("c.jsonl"), g_jsonl);
    char hf[600];
    snprintf(hf, sizeof hf, "%s/hfdir", tu_tmpdir());
    snprintf(args, sizeof args, "export %s --out %s --dtype bf16", tu_model_path(), hf);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(args, sizeof args, "data --tokenizer %s --out %s %s", tu_model_path(), tu_tmp_path("g.shard"),
             tu_tmp_path("c.jsonl"));
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(args, sizeof args, "data --tokenizer %s --out %s %s", hf, tu_tmp_path("f.shard"), tu_tmp_path("c.jsonl"));
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    size_t n1, n2;
    char *a = slurp(tu_tmp_path("g.shard"), &n1), *b = slurp(tu_tmp_path("f.shard"), &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a), free(b);
}

// --generate: documents sampled from the model; deterministic for a seed.
static void test_generate(void **state) {
    const tok_t *t = smol();
    write_str(tu_tmp_path("prompts.txt"), "Say hello.\n\nName a fruit.\n");
    char args[1600];
    snprintf(args, sizeof args, "data --generate 3 --model %s --prompts %s -n 40 --seed 5 --assistant-only --out %s",
             tu_model_path(), tu_tmp_path("prompts.txt"), tu_tmp_path("gen1.shard"));
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(args, sizeof args, "data --generate 3 --model %s --prompts %s -n 40 --seed 5 --assistant-only --out %s",
             tu_model_path(), tu_tmp_path("prompts.txt"), tu_tmp_path("gen2.shard"));
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    size_t n1, n2;
    char *a = slurp(tu_tmp_path("gen1.shard"), &n1), *b = slurp(tu_tmp_path("gen2.shard"), &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a), free(b);
    shard_dump_t d = dump(tu_tmp_path("gen1.shard"));
    assert_int_equal(d.n_docs, 3);
    assert_true(d.hash == tok_hash(t));
    const char *prompts[3] = {"Say hello.", "Name a fruit.", "Say hello."};
    int stopped = 0; // answers that ended with the model's own EOS (short prompts: some do within 40)
    for (int i = 0; i < 3; i++) {
        tok_msg_t m = {"user", prompts[i]};
        char *r;
        int32_t *ids;
        int n;
        assert_int_equal(tok_chat_render(t, &m, 1, 1, &r), 0);
        assert_int_equal(tok_encode_ex(t, r, strlen(r), TOK_SPECIAL, &ids, &n), 0);
        int64_t s = d.docs[i], len = doc_len(&d, i);
        assert_true(len >= n + 1 && len <= n + 40 + 1); // prompt, at most 40 sampled, EOS
        assert_memory_equal(d.ids + s, ids, (size_t)n * sizeof *ids);
        assert_int_equal(d.ids[s + len - 1], t->eos);
        assert_int_not_equal(d.ids[s + len - 2], t->eos); // one EOS, never the model's and another
        // the answer and its end of turn only: through the last token when the
        // model wrote that EOS itself (it stopped within -n), else before it
        int64_t e = d.mask[s + len - 1] ? len : len - 1;
        if (e == len) assert_true(len <= n + 40);
        stopped += e == len;
        for (int64_t k = 0; k < len; k++)
            assert_int_equal(d.mask[s + k], k >= n && k < e);
        free(r), free(ids);
    }
    assert_true(stopped >= 1);
    dump_free(&d);
}

// --generate --self-instruct --batch: the model writes the user's message too,
// two sequences per batch. Every document is the template's head, a sampled
// message, the assistant header, a sampled answer and EOS; the mask covers
// the answer and its end of turn; a seed reproduces the shard; --show prints it.
static void test_generate_self_instruct(void **state) {
    const tok_t *t = smol();
    char args[1600];
    for (int r = 0; r < 2; r++) {
        snprintf(args, sizeof args,
                 "data --generate 3 --batch 2 --self-instruct --model %s -n 12 --seed 7 --assistant-only --out %s",
                 tu_model_path(), tu_tmp_path(r ? "si2.shard" : "si1.shard"));
        assert_int_equal(tu_run_hylo(args, NULL), 0);
    }
    size_t n1, n2;
    char *a = slurp(tu_tmp_path("si1.shard"), &n1), *b = slurp(tu_tmp_path("si2.shard"), &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a), free(b);
    // the head and the header, cut from a rendered message "X"
    tok_msg_t m = {"user", "X"};
    char *txt;
    assert_int_equal(tok_chat_render(t, &m, 1, 1, &txt), 0);
    char *x = strstr(txt, "X");
    assert_non_null(x);
    int32_t *head, *hdr;
    int nh, nd;
    assert_int_equal(tok_encode_ex(t, txt, (size_t)(x - txt), TOK_SPECIAL, &head, &nh), 0);
    assert_int_equal(tok_encode_ex(t, x + 1, strlen(x + 1), TOK_SPECIAL, &hdr, &nd), 0);
    shard_dump_t d = dump(tu_tmp_path("si1.shard"));
    assert_int_equal(d.n_docs, 3); // the second batch's second sequence is dropped
    int answered = 0;
    for (int i = 0; i < 3; i++) {
        int64_t s = d.docs[i], len = doc_len(&d, i);
        assert_true(len <= nh + 12 + 2);
        assert_memory_equal(d.ids + s, head, (size_t)nh * sizeof *head);
        assert_int_equal(d.ids[s + len - 1], t->eos);
        int64_t at = -1; // where the header ends, when the message ended within -n
        for (int64_t k = nh; k + nd <= len && at < 0; k++)
            if (!memcmp(d.ids + s + k, hdr, (size_t)nd * sizeof *hdr)) at = k + nd;
        answered += at >= 0;
        assert_int_not_equal(d.ids[s + len - 2], t->eos); // one EOS
        int64_t e = d.mask[s + len - 1] ? len : len - 1;  // the model's own EOS is in the loss
        if (e == len) assert_true(at >= 0 && len - at <= 12);
        for (int64_t k = 0; k < len; k++)
            assert_int_equal(d.mask[s + k], at >= 0 && k >= at && k < e);
    }
    assert_true(answered >= 1); // -n 12 forces the header after 6 sampled tokens at the latest
    dump_free(&d);
    free(txt), free(head), free(hdr);
    snprintf(args, sizeof args, "data --show 1 --tokenizer %s %s", tu_model_path(), tu_tmp_path("si1.shard"));
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    size_t no;
    char *out = slurp(tu_tmp_path("out.txt"), &no);
    assert_non_null(strstr(out, "---- document 0"));
    assert_non_null(strstr(out, "[[<|im_start|>system"));
    free(out);
}

int main(void) {
    log_set_level(LOG_WARN); // the loader's info lines (one per open) would drown a failure's output
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_tok_hash),
        cmocka_unit_test(test_txt),
        cmocka_unit_test(test_jsonl),
        cmocka_unit_test(test_jsonl_zst),
        cmocka_unit_test(test_assistant_only),
        cmocka_unit_test(test_assistant_only_llama3),
        cmocka_unit_test(test_malformed_lines),
        cmocka_unit_test(test_malformed_cli),
        cmocka_unit_test(test_folder_inputs),
        cmocka_unit_test(test_threads_deterministic),
        cmocka_unit_test(test_essays),
        cmocka_unit_test(test_shard_refusals),
        cmocka_unit_test(test_loader_windows),
        cmocka_unit_test(test_loader_too_small),
        cmocka_unit_test(test_loader_shuffle),
        cmocka_unit_test(test_loader_mix),
        cmocka_unit_test(test_loader_ranks),
        cmocka_unit_test(test_loader_seek),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_generate_self_instruct),
    };
    int rc = cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
    if (g_tok_ok) tok_free(&g_tok);
    return rc;
}
