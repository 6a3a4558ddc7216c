// Token shard reader (validating) and writer; the layout is in shard.h.
#include "train/shard.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/err.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards are read on little-endian hosts only");

// Header field offsets.
enum {
    H_MAGIC = 0,
    H_VERSION = 8,
    H_HEADER_BYTES = 12,
    H_TOK_HASH = 16,
    H_N_VOCAB = 24,
    H_TOKEN_BYTES = 28,
    H_N_TOKENS = 32,
    H_N_DOCS = 40,
    H_RESERVED0 = 48,
    H_PAYLOAD_CRC = 52,
    H_RESERVED1 = 56,
    H_HEADER_CRC = 60,
};

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

int64_t data_shard_doc_start(const data_shard_t *s, int64_t i) { return (int64_t)get64(s->docs + 8 * i); }

// ---------------------------------------------------------------------------
// Reader

static int check_header(data_shard_t *s, const char *path) {
    const uint8_t *h = s->mf.data;
    size_t size = s->mf.size;
    if (size < DATA_SHARD_HEADER_BYTES)
        return err_set(ERR_INPUT, "%s: %zu bytes, shorter than the %d-byte shard header (truncated?)", path, size,
                       DATA_SHARD_HEADER_BYTES);
    if (memcmp(h + H_MAGIC, DATA_SHARD_MAGIC, 8) != 0)
        return err_set(ERR_INPUT, "%s: not a hylo token shard (magic \"%.8s\" expected, found other bytes)", path,
                       DATA_SHARD_MAGIC);
    uint32_t version = get32(h + H_VERSION);
    if (version != DATA_SHARD_VERSION)
        return err_set(ERR_UNSUP, "%s: shard version %" PRIu32 " (this hylo reads version %d)", path, version,
                       DATA_SHARD_VERSION);
    uint32_t hb = get32(h + H_HEADER_BYTES);
    if (hb != DATA_SHARD_HEADER_BYTES)
        return err_set(ERR_INPUT, "%s: header size %" PRIu32 ", expected %d", path, hb, DATA_SHARD_HEADER_BYTES);
    uint32_t crc = crc32c(0, h, H_HEADER_CRC), want = get32(h + H_HEADER_CRC);
    if (crc != want)
        return err_set(ERR_INPUT,
                       "%s: header CRC-32C 0x%08" PRIx32 " does not match the stored 0x%08" PRIx32
                       " (corrupted header)",
                       path, crc, want);
    if (get32(h + H_RESERVED0) || get32(h + H_RESERVED1))
        return err_set(ERR_INPUT, "%s: reserved header fields are not zero", path);
    s->tok_hash = get64(h + H_TOK_HASH);
    uint32_t V = get32(h + H_N_VOCAB), tb = get32(h + H_TOKEN_BYTES);
    if (V < 1 || V > INT32_MAX) return err_set(ERR_INPUT, "%s: vocabulary size %" PRIu32 " out of range", path, V);
    uint32_t want_tb = V <= 65536 ? 2 : 4;
    if (tb != want_tb)
        return err_set(ERR_INPUT, "%s: %" PRIu32 " bytes per token, expected %" PRIu32 " for a vocabulary of %" PRIu32,
                       path, tb, want_tb, V);
    s->n_vocab = (int)V;
    s->token_bytes = (int)tb;
    // Counts are bounded by the file size before any size is computed from them.
    uint64_t body = size - DATA_SHARD_HEADER_BYTES;
    uint64_t nt = get64(h + H_N_TOKENS), nd = get64(h + H_N_DOCS);
    if (nt > body / tb)
        return err_set(ERR_INPUT,
                       "%s: %" PRIu64 " tokens of %" PRIu32 " bytes do not fit in the %" PRIu64
                       " bytes after the header (truncated?)",
                       path, nt, tb, body);
    if (nd > body / 8)
        return err_set(ERR_INPUT,
                       "%s: %" PRIu64 " documents do not fit in the %" PRIu64 " bytes after the header (truncated?)",
                       path, nd, body);
    if (nd == 0 || nt == 0)
        return err_set(ERR_INPUT, "%s: %" PRIu64 " tokens in %" PRIu64 " documents: a shard holds at least one", path,
                       nt, nd);
    uint64_t tok_sz = pad8(nt * tb), mask_sz = pad8((nt + 7) / 8), docs_sz = nd * 8;
    uint64_t need = DATA_SHARD_HEADER_BYTES + tok_sz + mask_sz + docs_sz;
    if (need != size)
        return err_set(ERR_INPUT,
                       "%s: %zu bytes, but the header describes %" PRIu64 " (%" PRIu64 " tokens, %" PRIu64
                       " documents): %s",
                       path, size, need, nt, nd, size < need ? "truncated" : "trailing bytes");
    s->n_tokens = (int64_t)nt;
    s->n_docs = (int64_t)nd;
    s->tokens = h + DATA_SHARD_HEADER_BYTES;
    s->mask = s->tokens + tok_sz;
    s->docs = s->mask + mask_sz;
    crc = crc32c(0, s->tokens, size - DATA_SHARD_HEADER_BYTES);
    want = get32(h + H_PAYLOAD_CRC);
    if (crc != want)
        return err_set(ERR_INPUT,
                       "%s: payload CRC-32C 0x%08" PRIx32 " does not match the stored 0x%08" PRIx32 " (corrupted data)",
                       path, crc, want);
    return 0;
}

// What the CRC cannot vouch for (a file written to match it): ids and index.
static int check_payload(const data_shard_t *s, const char *path) {
    int64_t n = s->n_tokens;
    if (s->token_bytes == 2 && s->n_vocab >= 65536) {
        // every u16 is a valid id
    } else {
        for (int64_t i = 0; i < n; i++) {
            int32_t id = data_shard_token(s, i);
            if (id < 0 || id >= s->n_vocab)
                return err_set(ERR_INPUT, "%s: token %" PRId64 " is id %" PRId32 ", outside the vocabulary [0, %d)",
                               path, i, id, s->n_vocab);
        }
    }
    int64_t prev = -1;
    for (int64_t i = 0; i < s->n_docs; i++) {
        uint64_t st = get64(s->docs + 8 * i);
        if ((i == 0 && st != 0) || (int64_t)st <= prev || st >= (uint64_t)n)
            return err_set(ERR_INPUT, "%s: document %" PRId64 " starts at token %" PRIu64 ", expected %s", path, i, st,
                           i == 0 ? "0" : "after the previous start and before the token count");
        prev = (int64_t)st;
    }
    return 0;
}

int data_shard_open(data_shard_t *s, const char *path) {
    memset(s, 0, sizeof *s);
    TRY(mfile_open(&s->mf, path));
    int rc = check_header(s, path);
    if (rc == 0) rc = check_payload(s, path);
    if (rc < 0) data_shard_close(s);
    return rc;
}

void data_shard_close(data_shard_t *s) {
    mfile_close(&s->mf);
    memset(s, 0, sizeof *s);
    s->mf.fd = -1;
}

// ---------------------------------------------------------------------------
// Writer

#define WBUF_BYTES (1 << 20)

struct data_shard_writer {
    afile_t af;
    uint64_t tok_hash;
    int n_vocab, token_bytes;
    uint32_t crc;
    uint8_t *buf; // pending token bytes
    size_t nbuf;
    int64_t n_tokens;
    uint8_t *mask; // bitmap
    size_t mask_cap;
    int64_t *docs;
    int64_t n_docs, docs_cap;
};

static int wr(data_shard_writer_t *w, const void *p, size_t n) {
    w->crc = crc32c(w->crc, p, n);
    return fs_write(&w->af, p, n);
}

static int flush_tokens(data_shard_writer_t *w) {
    int rc = wr(w, w->buf, w->nbuf);
    w->nbuf = 0;
    return rc;
}

int data_shard_create(data_shard_writer_t **out, const char *path, uint64_t tok_hash, int n_vocab) {
    *out = NULL;
    if (n_vocab < 1) return err_set(ERR_INPUT, "%s: vocabulary size %d", path, n_vocab);
    data_shard_writer_t *w = calloc(1, sizeof *w);
    if (!w || !(w->buf = malloc(WBUF_BYTES))) {
        free(w);
        return err_set(ERR_NOMEM, "%s: out of memory", path);
    }
    w->tok_hash = tok_hash;
    w->n_vocab = n_vocab;
    w->token_bytes = n_vocab <= 65536 ? 2 : 4;
    int rc = fs_atomic_open(&w->af, path);
    uint8_t zero[DATA_SHARD_HEADER_BYTES] = {0}; // the header is written last
    if (rc == 0 && (rc = fs_write(&w->af, zero, sizeof zero)) < 0) fs_atomic_abort(&w->af);
    if (rc < 0) {
        free(w->buf);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int64_t data_shard_writer_tokens(const data_shard_writer_t *w) { return w->n_tokens; }
int64_t data_shard_writer_docs(const data_shard_writer_t *w) { return w->n_docs; }

int data_shard_add(data_shard_writer_t *w, const int32_t *ids, const uint8_t *mask, int64_t n) {
    if (n < 1) return err_set(ERR_INPUT, "%s: an empty document", w->af.path);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->n_vocab)
            return err_set(ERR_INPUT, "%s: document %" PRId64 ": id %" PRId32 " outside the vocabulary [0, %d)",
                           w->af.path, w->n_docs, ids[i], w->n_vocab);
    if (w->n_docs == w->docs_cap) {
        int64_t cap = w->docs_cap ? 2 * w->docs_cap : 1024;
        int64_t *d = realloc(w->docs, (size_t)cap * sizeof *d);
        if (!d) return err_set(ERR_NOMEM, "%s: out of memory", w->af.path);
        w->docs = d, w->docs_cap = cap;
    }
    size_t need = (size_t)((w->n_tokens + n + 7) / 8);
    if (need > w->mask_cap) {
        size_t cap = w->mask_cap ? w->mask_cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *m = realloc(w->mask, cap);
        if (!m) return err_set(ERR_NOMEM, "%s: out of memory", w->af.path);
        memset(m + w->mask_cap, 0, cap - w->mask_cap);
        w->mask = m, w->mask_cap = cap;
    }
    w->docs[w->n_docs++] = w->n_tokens;
    for (int64_t i = 0; i < n; i++) {
        if (w->nbuf + 4 > WBUF_BYTES) TRY(flush_tokens(w));
        uint32_t v = (uint32_t)ids[i];
        w->buf[w->nbuf++] = (uint8_t)v;
        w->buf[w->nbuf++] = (uint8_t)(v >> 8);
        if (w->token_bytes == 4) {
            w->buf[w->nbuf++] = (uint8_t)(v >> 16);
            w->buf[w->nbuf++] = (uint8_t)(v >> 24);
        }
        int64_t k = w->n_tokens + i;
        if (!mask || mask[i]) w->mask[k >> 3] |= (uint8_t)(1u << (k & 7));
    }
    w->n_tokens += n;
    return 0;
}

static void writer_free(data_shard_writer_t *w) {
    free(w->buf), free(w->mask), free(w->docs);
    free(w);
}

void data_shard_abort(data_shard_writer_t *w) {
    if (!w) return;
    fs_atomic_abort(&w->af);
    writer_free(w);
}

static int finish(data_shard_writer_t *w) {
    if (w->n_docs == 0) return err_set(ERR_INPUT, "%s: no documents to write", w->af.path);
    static const uint8_t zero[8] = {0};
    uint64_t nt = (uint64_t)w->n_tokens;
    TRY(flush_tokens(w));
    uint64_t tok = nt * (uint64_t)w->token_bytes, mask = (nt + 7) / 8;
    TRY(wr(w, zero, pad8(tok) - tok));
    TRY(wr(w, w->mask, mask));
    TRY(wr(w, zero, pad8(mask) - mask));
    for (int64_t i = 0; i < w->n_docs; i += WBUF_BYTES / 8) {
        int64_t m = w->n_docs - i < WBUF_BYTES / 8 ? w->n_docs - i : WBUF_BYTES / 8;
        for (int64_t j = 0; j < m; j++)
            put64(w->buf + 8 * j, (uint64_t)w->docs[i + j]);
        TRY(wr(w, w->buf, (size_t)m * 8));
    }
    uint8_t h[DATA_SHARD_HEADER_BYTES] = {0};
    memcpy(h + H_MAGIC, DATA_SHARD_MAGIC, 8);
    put32(h + H_VERSION, DATA_SHARD_VERSION);
    put32(h + H_HEADER_BYTES, DATA_SHARD_HEADER_BYTES);
    put64(h + H_TOK_HASH, w->tok_hash);
    put32(h + H_N_VOCAB, (uint32_t)w->n_vocab);
    put32(h + H_TOKEN_BYTES, (uint32_t)w->token_bytes);
    put64(h + H_N_TOKENS, nt);
    put64(h + H_N_DOCS, (uint64_t)w->n_docs);
    put32(h + H_PAYLOAD_CRC, w->crc);
    put32(h + H_HEADER_CRC, crc32c(0, h, H_HEADER_CRC));
    if (fseek(w->af.f, 0, SEEK_SET) != 0) return err_set(ERR_IO, "%s: cannot seek: %s", w->af.tmp, strerror(errno));
    return fs_write(&w->af, h, sizeof h);
}

int data_shard_finish(data_shard_writer_t *w) {
    int rc = finish(w);
    if (rc == 0) {
        rc = fs_atomic_commit(&w->af);
    } else {
        fs_atomic_abort(&w->af);
    }
    writer_free(w);
    return rc;
}
