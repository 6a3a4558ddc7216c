// Inputs -> documents -> token shard (corpus.h). The main thread reads the
// files (zstd streams decompressed as they are read) and gathers documents in
// batches; the batch is encoded by OpenMP threads (JSON parsing, chat
// rendering and tokenization, which is where the time goes) and then written
// in input order, so the shard does not depend on the thread count.
#include "train/corpus.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "train/shard.h"

// The tokenizer takes texts of up to INT32_MAX / 2 bytes (tok_encode_ex).
#define DOC_MAX_BYTES ((size_t)INT32_MAX / 2)
// A batch is encoded once it holds this much text or this many documents.
#define BATCH_BYTES ((size_t)8 << 20)
#define BATCH_DOCS 16384

// ---------------------------------------------------------------------------
// Input listing

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int is_input(const char *p) {
    return ends_with(p, ".txt") || ends_with(p, ".jsonl") || ends_with(p, ".jsonl.zst");
}

typedef struct {
    char **v;
    int n, cap;
} strvec_t;

static int vec_push(strvec_t *s, const char *p) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        char **nv = realloc(s->v, (size_t)cap * sizeof *nv);
        if (!nv) return err_set(ERR_NOMEM, "out of memory");
        s->v = nv, s->cap = cap;
    }
    if (!(s->v[s->n] = strdup(p))) return err_set(ERR_NOMEM, "out of memory");
    s->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int walk(const char *dir, strvec_t *out, int depth) {
    if (depth > 64) return err_set(ERR_INPUT, "%s: folders nested more than 64 deep (a symlink loop?)", dir);
    DIR *d = opendir(dir);
    if (!d) return err_set(ERR_INPUT, "%s: cannot open the folder: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[4096];
        if ((rc = fs_join(p, sizeof p, dir, de->d_name)) < 0) break;
        if (fs_is_dir(p))
            rc = walk(p, out, depth + 1);
        else if (is_input(p))
            rc = vec_push(out, p);
    }
    closedir(d);
    return rc;
}

int data_list_inputs(const char *const *inputs, int n_inputs, char ***files, int *n_files) {
    *files = NULL;
    *n_files = 0;
    strvec_t out = {0};
    int rc = 0;
    for (int i = 0; i < n_inputs && rc == 0; i++) {
        if (fs_is_dir(inputs[i])) {
            int first = out.n;
            rc = walk(inputs[i], &out, 0);
            if (rc == 0) qsort(out.v + first, (size_t)(out.n - first), sizeof *out.v, cmp_str);
            if (rc == 0 && out.n == first) log_warn("%s: no .txt, .jsonl or .jsonl.zst files under it", inputs[i]);
        } else if (!fs_exists(inputs[i])) {
            rc = err_set(ERR_INPUT, "%s: no such file or folder", inputs[i]);
        } else if (!is_input(inputs[i])) {
            rc = err_set(ERR_INPUT, "%s: not an input hylo data reads (.txt, .jsonl, .jsonl.zst, or a folder)",
                         inputs[i]);
        } else {
            rc = vec_push(&out, inputs[i]);
        }
    }
    if (rc < 0) {
        data_free_list(out.v, out.n);
        return rc;
    }
    *files = out.v;
    *n_files = out.n;
    return 0;
}

void data_free_list(char **files, int n_files) {
    for (int i = 0; i < n_files; i++)
        free(files[i]);
    free(files);
}

// ---------------------------------------------------------------------------
// Documents

void data_doc_free(data_doc_t *d) {
    free(d->ids);
    free(d->mask);
    memset(d, 0, sizeof *d);
}

static int64_t count_lines(const char *s, size_t n) {
    int64_t k = 1;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

// d = [bos] ids [eos]; mask (when wanted) copied from m (NULL: all 1) with
// eos_mask for the EOS.
static int doc_assemble(const tok_t *t, data_doc_t *d, int bos, const int32_t *ids, int n, const uint8_t *m,
                        int want_mask, int eos_mask) {
    int64_t k = (int64_t)n + bos + 1;
    d->ids = malloc((size_t)k * sizeof *d->ids);
    d->mask = want_mask ? malloc((size_t)k) : NULL;
    if (!d->ids || (want_mask && !d->mask)) {
        data_doc_free(d);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int64_t j = 0;
    if (bos) {
        if (d->mask) d->mask[j] = 1;
        d->ids[j++] = t->bos;
    }
    memcpy(d->ids + j, ids, (size_t)n * sizeof *ids);
    if (d->mask) {
        if (m)
            memcpy(d->mask + j, m, (size_t)n);
        else
            memset(d->mask + j, 1, (size_t)n);
    }
    j += n;
    if (d->mask) d->mask[j] = (uint8_t)eos_mask;
    d->ids[j++] = t->eos;
    d->n = j;
    return 0;
}

int data_doc_text(const tok_t *t, const char *text, size_t len, data_doc_t *d, char *why, size_t cap,
                  int64_t *bad_line) {
    memset(d, 0, sizeof *d);
    *bad_line = 1;
    size_t off = utf8_check((const uint8_t *)text, len);
    if (off < len) {
        size_t col0 = off;
        while (col0 > 0 && text[col0 - 1] != '\n')
            col0--;
        *bad_line = count_lines(text, off);
        snprintf(why, cap, "invalid UTF-8 (byte 0x%02x at column %zu)", (uint8_t)text[off], off - col0 + 1);
        return 1;
    }
    if (len == 0) {
        snprintf(why, cap, "empty document");
        return 1;
    }
    if (len > DOC_MAX_BYTES) {
        snprintf(why, cap, "a document of %zu bytes, more than the tokenizer takes (%zu)", len, DOC_MAX_BYTES);
        return 1;
    }
    if (t->eos < 0) return err_set(ERR_INPUT, "the tokenizer has no EOS token to end documents with");
    int32_t *ids;
    int n;
    TRY(tok_encode_ex(t, text, len, 0, &ids, &n));
    int rc = doc_assemble(t, d, t->add_bos && t->bos >= 0, ids, n, NULL, 0, 1);
    free(ids);
    return rc;
}

// "\u0000" as an escape: cJSON would end the string there, silently cutting it.
static int has_nul_escape(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (i + 5 < n && !memcmp(s + i + 1, "u0000", 5)) return 1;
        i++; // the escaped character
    }
    return 0;
}

// A cJSON string field as valid UTF-8; 1 (why set) when it is not.
static int utf8_field(const char *s, const char *name, char *why, size_t cap) {
    size_t n = strlen(s), off = utf8_check((const uint8_t *)s, n);
    if (off == n) return 0;
    snprintf(why, cap, "%s is not valid UTF-8 (byte 0x%02x at offset %zu)", name, (uint8_t)s[off], off);
    return 1;
}

typedef struct {
    size_t a, b; // byte range of the rendered text
} span_t;

// The byte ranges of the rendered conversation `full` that hold an assistant
// message's content and its end-of-turn token. For assistant message i the
// template renders msgs[0..i) as a prefix A, then header + content + footer;
// rendering msgs[0..i) + {assistant, SENTINEL} tells where header and footer
// end, so the content is found whatever the template does to it (Llama 3
// trims it). Returns 1 (why set) when the rendering is not incremental that
// way, which a template would have to be for the mask to be placed.
static int assistant_spans(const tok_t *t, const tok_msg_t *msgs, int n, const char *full, span_t *sp, int *n_sp,
                           char *why, size_t cap) {
    static const char sentinel[] = "\x01hylo-assistant-content\x01";
    const size_t ls = sizeof sentinel - 1, lf = strlen(full);
    int32_t eot[16];
    int n_eot = tok_eot_ids(t, eot, 16);
    if (n_eot > 16) n_eot = 16;
    tok_msg_t *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return err_set(ERR_NOMEM, "out of memory");
    memcpy(tmp, msgs, (size_t)n * sizeof *tmp);
    int rc = 0, k = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (strcmp(msgs[i].role, "assistant")) continue;
        char *A = NULL, *B = NULL, *C = NULL;
        tmp[i].content = sentinel;
        rc = tok_chat_render(t, msgs, i, 0, &A);
        if (rc == 0) rc = tok_chat_render(t, msgs, i + 1, 0, &B);
        if (rc == 0) rc = tok_chat_render(t, tmp, i + 1, 0, &C);
        tmp[i].content = msgs[i].content;
        if (rc < 0) {
            free(A), free(B), free(C);
            break;
        }
        size_t la = strlen(A), lb = strlen(B), lc = strlen(C);
        const char *s = lc >= la && !memcmp(C, A, la) ? strstr(C + la, sentinel) : NULL;
        size_t hdr = s ? (size_t)(s - C) - la : 0, ftr = s ? lc - (size_t)(s - C) - ls : 0;
        if (!s || lb < la + hdr + ftr || memcmp(B, A, la) || memcmp(B + la, C + la, hdr) ||
            memcmp(B + lb - ftr, C + lc - ftr, ftr) || lb > lf || memcmp(full, B, lb)) {
            snprintf(why, cap,
                     "messages[%d]: the chat template does not render this conversation message by "
                     "message, so --assistant-only cannot place the mask",
                     i);
            rc = 1;
        } else {
            // The end-of-turn token that opens the footer belongs to the answer.
            size_t a = la + hdr, b = lb - ftr, best = 0;
            for (int e = 0; e < n_eot; e++) {
                size_t l;
                const char *txt = tok_text(t, eot[e], &l);
                if (txt && l > best && l <= ftr && !memcmp(B + b, txt, l)) best = l;
            }
            sp[k++] = (span_t){a, b + best};
        }
        free(A), free(B), free(C);
    }
    free(tmp);
    *n_sp = k;
    return rc;
}

// Mask of the tokens ids[0..n) of text (length len): 1 where a token's bytes
// overlap a span. 1 (why set) when the tokens do not spell the text exactly.
static int mask_from_spans(const tok_t *t, const int32_t *ids, int n, size_t len, const span_t *sp, int n_sp,
                           uint8_t *m, char *why, size_t cap) {
    size_t o = 0;
    int s = 0;
    for (int k = 0; k < n; k++) {
        size_t l;
        tok_bytes(t, ids[k], &l);
        while (s < n_sp && sp[s].b <= o)
            s++;
        m[k] = s < n_sp && o < sp[s].b && o + l > sp[s].a;
        o += l;
    }
    if (o != len) {
        snprintf(why, cap, "the tokens spell %zu bytes of the %zu rendered, so the assistant mask cannot be placed", o,
                 len);
        return 1;
    }
    return 0;
}

static int doc_chat(const tok_t *t, const cJSON *msgs, int assistant_only, data_doc_t *d, char *why, size_t cap) {
    if (!cJSON_IsArray(msgs)) {
        snprintf(why, cap, "\"messages\" is not an array");
        return 1;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) {
        snprintf(why, cap, "\"messages\" is empty");
        return 1;
    }
    tok_msg_t *m = calloc((size_t)n, sizeof *m);
    span_t *sp = calloc((size_t)n, sizeof *sp);
    if (!m || !sp) {
        free(m), free(sp);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int rc = 0, i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, msgs) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        char name[64];
        if (!cJSON_IsObject(e)) {
            snprintf(why, cap, "messages[%d] is not an object", i);
            rc = 1;
        } else if (!cJSON_IsString(r) || !r->valuestring[0]) {
            snprintf(why, cap, "messages[%d].role is %s", i, r ? "not a non-empty string" : "missing");
            rc = 1;
        } else if (!cJSON_IsString(c)) {
            snprintf(why, cap, "messages[%d].content is %s", i, c ? "not a string" : "missing");
            rc = 1;
        } else if (snprintf(name, sizeof name, "messages[%d].role", i), utf8_field(r->valuestring, name, why, cap)) {
            rc = 1;
        } else if (snprintf(name, sizeof name, "messages[%d].content", i), utf8_field(c->valuestring, name, why, cap)) {
            rc = 1;
        }
        if (rc) break;
        m[i++] = (tok_msg_t){r->valuestring, c->valuestring};
    }
    char *text = NULL;
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    int k = 0, n_sp = 0;
    if (rc == 0) rc = tok_chat_render(t, m, n, 0, &text);
    size_t len = text ? strlen(text) : 0;
    if (rc == 0 && len > DOC_MAX_BYTES) {
        snprintf(why, cap, "a conversation of %zu bytes, more than the tokenizer takes (%zu)", len, DOC_MAX_BYTES);
        rc = 1;
    }
    if (rc == 0) rc = tok_encode_ex(t, text, len, TOK_SPECIAL, &ids, &k);
    if (rc == 0 && assistant_only) rc = assistant_spans(t, m, n, text, sp, &n_sp, why, cap);
    if (rc == 0 && assistant_only) {
        mask = malloc((size_t)k + 1);
        rc = mask ? mask_from_spans(t, ids, k, len, sp, n_sp, mask, why, cap) : err_set(ERR_NOMEM, "out of memory");
    }
    if (rc == 0) rc = doc_assemble(t, d, 0, ids, k, mask, assistant_only, !assistant_only);
    free(text), free(ids), free(mask), free(m), free(sp);
    return rc;
}

int data_doc_json(const tok_t *t, const char *line, size_t len, int assistant_only, data_doc_t *d, char *why,
                  size_t cap) {
    memset(d, 0, sizeof *d);
    if (t->eos < 0) return err_set(ERR_INPUT, "the tokenizer has no EOS token to end documents with");
    if (has_nul_escape(line, len)) {
        snprintf(why, cap, "a string holds \\u0000 (NUL), which text documents may not contain");
        return 1;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (j && end) { // only white space may follow the object
        while (end < line + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
            end++;
        if (end < line + len) {
            snprintf(why, cap, "bad JSON: text after the value at byte %zu", (size_t)(end - line) + 1);
            cJSON_Delete(j);
            return 1;
        }
    }
    if (!j) {
        if (end && end >= line && end <= line + len)
            snprintf(why, cap, "bad JSON (at byte %zu)", (size_t)(end - line) + 1);
        else
            snprintf(why, cap, "bad JSON");
        return 1;
    }
    int rc = 1;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!cJSON_IsObject(j)) {
        snprintf(why, cap, "not a JSON object");
    } else if (text && msgs) {
        snprintf(why, cap, "both \"text\" and \"messages\": which one is the document is not guessed");
    } else if (!text && !msgs) {
        snprintf(why, cap, "no \"text\" or \"messages\" field");
    } else if (msgs) {
        rc = doc_chat(t, msgs, assistant_only, d, why, cap);
    } else if (!cJSON_IsString(text)) {
        snprintf(why, cap, "\"text\" is not a string");
    } else if (!text->valuestring[0]) {
        snprintf(why, cap, "\"text\" is empty");
    } else if (!utf8_field(text->valuestring, "\"text\"", why, cap)) {
        int64_t bad;
        rc = data_doc_text(t, text->valuestring, strlen(text->valuestring), d, why, cap, &bad);
    }
    cJSON_Delete(j);
    return rc;
}

// ---------------------------------------------------------------------------
// Reading lines from a plain or zstd-compressed file

typedef struct {
    const char *path;
    FILE *f;
    ZSTD_DCtx *z; // NULL: plain file
    uint8_t *zin;
    size_t zin_cap;
    ZSTD_inBuffer in;
    size_t zret;                // last ZSTD_decompressStream result: 0 at the end of a frame
    char *buf;                  // decoded bytes; [pos, len) not handed out yet
    size_t cap, len, pos, scan; // scan: bytes after pos known to hold no newline
    int eof;
    int64_t line; // lines handed out
    int64_t bytes;
} reader_t;

static int reader_open(reader_t *r, const char *path) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = fopen(path, "rb");
    if (!r->f) return err_set(errno == ENOENT ? ERR_INPUT : ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    r->cap = (size_t)1 << 20;
    r->buf = malloc(r->cap);
    if (!r->buf) return err_set(ERR_NOMEM, "out of memory");
    if (ends_with(path, ".zst")) {
        r->z = ZSTD_createDCtx();
        r->zin_cap = ZSTD_DStreamInSize();
        r->zin = malloc(r->zin_cap);
        if (!r->z || !r->zin) return err_set(ERR_NOMEM, "out of memory");
        r->in = (ZSTD_inBuffer){r->zin, 0, 0};
    }
    return 0;
}

static void reader_close(reader_t *r) {
    if (r->f) fclose(r->f);
    if (r->z) ZSTD_freeDCtx(r->z);
    free(r->zin);
    free(r->buf);
    memset(r, 0, sizeof *r);
}

// Appends more decoded bytes to buf (moving the pending ones to its start
// first); sets eof when the file is exhausted.
static int reader_fill(reader_t *r) {
    if (r->pos > 0) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    if (r->len == r->cap) {
        if (r->cap >= DOC_MAX_BYTES)
            return err_set(ERR_INPUT, "%s:%" PRId64 ": a line longer than %zu bytes", r->path, r->line + 1,
                           DOC_MAX_BYTES);
        char *nb = realloc(r->buf, 2 * r->cap);
        if (!nb) return err_set(ERR_NOMEM, "out of memory");
        r->buf = nb, r->cap *= 2;
    }
    if (!r->z) {
        size_t got = fread(r->buf + r->len, 1, r->cap - r->len, r->f);
        if (got == 0 && ferror(r->f)) return err_set(ERR_IO, "%s: read failed: %s", r->path, strerror(errno));
        if (got == 0) r->eof = 1;
        r->len += got;
        r->bytes += (int64_t)got;
        return 0;
    }
    for (;;) {
        if (r->in.pos == r->in.size) {
            size_t got = fread(r->zin, 1, r->zin_cap, r->f);
            if (got == 0 && ferror(r->f)) return err_set(ERR_IO, "%s: read failed: %s", r->path, strerror(errno));
            if (got == 0) {
                if (r->zret != 0)
                    return err_set(ERR_INPUT, "%s: the zstd stream ends inside a frame (truncated file)", r->path);
                r->eof = 1;
                return 0;
            }
            r->in = (ZSTD_inBuffer){r->zin, got, 0};
        }
        ZSTD_outBuffer out = {r->buf + r->len, r->cap - r->len, 0};
        r->zret = ZSTD_decompressStream(r->z, &out, &r->in);
        if (ZSTD_isError(r->zret))
            return err_set(ERR_INPUT, "%s: zstd: %s (after %" PRId64 " decompressed bytes)", r->path,
                           ZSTD_getErrorName(r->zret), r->bytes);
        r->len += out.pos;
        r->bytes += (int64_t)out.pos;
        if (out.pos > 0) return 0;
    }
}

// The next line (without "\n" or "\r\n"): 1 with *s, *n set; 0 at the end.
static int reader_line(reader_t *r, const char **s, size_t *n) {
    for (;;) {
        char *start = r->buf + r->pos;
        char *nl = memchr(start + r->scan, '\n', r->len - r->pos - r->scan);
        if (nl || (r->eof && r->pos < r->len)) {
            size_t k = nl ? (size_t)(nl - start) : r->len - r->pos;
            r->pos += k + (nl != NULL);
            r->scan = 0;
            if (k > 0 && start[k - 1] == '\r') k--;
            *s = start;
            *n = k;
            r->line++;
            return 1;
        }
        if (r->eof) return 0;
        r->scan = r->len - r->pos;
        TRY(reader_fill(r));
    }
}

// ---------------------------------------------------------------------------
// Batches

enum { ITEM_TEXT, ITEM_JSON };

typedef struct {
    int file;
    int kind;
    int64_t line; // of the item's first line
    size_t off, len;
} item_t;

typedef struct {
    data_doc_t d;
    int status; // 0 ok, 1 malformed, < 0 error
    int64_t line;
    char why[512];
} result_t;

typedef struct {
    const tok_t *tok;
    const data_build_cfg_t *cfg;
    char **files;
    data_shard_writer_t *w;
    data_build_stats_t *st;
    item_t *it;
    result_t *res;
    int n, cap;
    char *text;
    size_t tlen, tcap;
    double t0, t_report;
} build_t;

static int batch_add(build_t *b, int file, int kind, int64_t line, const char *s, size_t n) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 1024;
        item_t *ni = realloc(b->it, (size_t)cap * sizeof *ni);
        if (ni) b->it = ni;
        result_t *nr = ni ? realloc(b->res, (size_t)cap * sizeof *nr) : NULL;
        if (!ni || !nr) return err_set(ERR_NOMEM, "out of memory");
        b->res = nr, b->cap = cap;
    }
    if (b->tlen + n + 1 > b->tcap) {
        size_t cap = b->tcap ? b->tcap : BATCH_BYTES;
        while (cap < b->tlen + n + 1)
            cap *= 2;
        char *nt = realloc(b->text, cap);
        if (!nt) return err_set(ERR_NOMEM, "out of memory");
        b->text = nt, b->tcap = cap;
    }
    memcpy(b->text + b->tlen, s, n);
    b->text[b->tlen + n] = 0;
    b->it[b->n++] = (item_t){file, kind, line, b->tlen, n};
    b->tlen += n + 1;
    return 0;
}

static void encode_item(const build_t *b, const item_t *it, result_t *r) {
    memset(r, 0, sizeof *r);
    r->line = it->line;
    const char *s = b->text + it->off;
    if (it->kind == ITEM_JSON) {
        r->status = data_doc_json(b->tok, s, it->len, b->cfg->assistant_only, &r->d, r->why, sizeof r->why);
    } else {
        int64_t bad = 1;
        r->status = data_doc_text(b->tok, s, it->len, &r->d, r->why, sizeof r->why, &bad);
        if (r->status == 1) r->line = it->line + bad - 1;
    }
    if (r->status < 0) snprintf(r->why, sizeof r->why, "%s", err_msg()); // the message lives in this thread
}

static int flush_batch(build_t *b) {
    int nt = b->cfg->threads > 0 ? b->cfg->threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int i = 0; i < b->n; i++)
        encode_item(b, &b->it[i], &b->res[i]);
    int rc = 0;
    for (int i = 0; i < b->n; i++) {
        result_t *r = &b->res[i];
        const char *file = b->files[b->it[i].file];
        if (rc < 0) {
        } else if (r->status < 0) {
            rc = err_set(r->status, "%s:%" PRId64 ": %s", file, r->line, r->why);
        } else if (r->status == 1 && b->cfg->strict) {
            rc = err_set(ERR_INPUT, "%s:%" PRId64 ": %s", file, r->line, r->why);
        } else if (r->status == 1) {
            log_warn("%s:%" PRId64 ": %s (skipped)", file, r->line, r->why);
            b->st->skipped++;
        } else if ((rc = data_shard_add(b->w, r->d.ids, r->d.mask, r->d.n)) == 0) {
            b->st->docs++;
            b->st->tokens += r->d.n;
            int64_t loss = r->d.n;
            if (r->d.mask)
                for (int64_t k = 0; k < r->d.n; k++)
                    loss -= !r->d.mask[k];
            b->st->loss_tokens += loss;
        }
        data_doc_free(&r->d);
    }
    b->n = 0;
    b->tlen = 0;
    double now = time_now();
    if (rc == 0 && now - b->t_report > 10) {
        b->t_report = now;
        log_info("data: %" PRId64 " documents, %" PRId64 " tokens so far (%.0f tokens/s)", b->st->docs, b->st->tokens,
                 b->st->tokens / (now - b->t0));
    }
    return rc;
}

static int batch_full(const build_t *b) { return b->n >= BATCH_DOCS || b->tlen >= BATCH_BYTES; }

static int read_file(build_t *b, int fi) {
    const char *path = b->files[fi];
    int kind = ends_with(path, ".txt") ? ITEM_TEXT : ITEM_JSON;
    if (kind == ITEM_TEXT && !b->cfg->split_lines) { // the whole file is one document
        char *s;
        size_t n;
        TRY(fs_read_all(path, &s, &n));
        b->st->bytes += (int64_t)n;
        int rc = batch_add(b, fi, ITEM_TEXT, 1, s, n);
        free(s);
        if (rc == 0 && batch_full(b)) rc = flush_batch(b);
        return rc;
    }
    reader_t r;
    int rc = reader_open(&r, path);
    const char *s;
    size_t n;
    while (rc == 0 && (rc = reader_line(&r, &s, &n)) == 1) {
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t'))
            k++;
        rc = 0;
        if (k == n) continue; // blank lines separate nothing
        rc = batch_add(b, fi, kind, r.line, s, n);
        if (rc == 0 && batch_full(b)) rc = flush_batch(b);
    }
    b->st->bytes += r.bytes;
    reader_close(&r);
    return rc;
}

int data_build(const char *out_path, const tok_t *tok, const char *const *inputs, int n_inputs,
               const data_build_cfg_t *cfg, data_build_stats_t *st) {
    memset(st, 0, sizeof *st);
    if (tok->eos < 0) return err_set(ERR_INPUT, "the tokenizer has no EOS token to end documents with");
    build_t b = {.tok = tok, .cfg = cfg, .st = st};
    int nf = 0;
    TRY(data_list_inputs(inputs, n_inputs, &b.files, &nf));
    if (nf == 0) {
        data_free_list(b.files, nf);
        return err_set(ERR_INPUT, "no input files");
    }
    st->files = nf;
    int rc = data_shard_create(&b.w, out_path, tok_hash(tok), tok->n_vocab);
    b.t0 = b.t_report = time_now();
    for (int i = 0; rc == 0 && i < nf; i++)
        rc = read_file(&b, i);
    if (rc == 0) rc = flush_batch(&b);
    if (rc == 0 && st->docs == 0) rc = err_set(ERR_INPUT, "no documents: every input was empty or skipped");
    if (b.w) {
        if (rc == 0)
            rc = data_shard_finish(b.w);
        else
            data_shard_abort(b.w);
    }
    st->seconds = time_now() - b.t0;
    free(b.it), free(b.res), free(b.text);
    data_free_list(b.files, nf);
    return rc;
}
