// Byte-level BPE core: vocabulary and merge tables, pre-tokenizer passes,
// BPE by merge rank, decoding, streaming decoding, end-of-turn ids.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "base/utf8.h"
#include "tok/tok_internal.h"

// ---------------------------------------------------------------------------
// Small helpers

char *tok_strndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

// FNV-1a; keys are short (tokens, words), so its speed is not the bottleneck.
uint64_t tok_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// other 68 are shifted to U+0100.. in byte order, so every byte is a visible char.
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

static uint16_t g_b2c[256];
static int16_t g_c2b[256 + 68];
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;

static void byte_map_init(void) {
    int n = 0;
    for (int i = 0; i < 256 + 68; i++)
        g_c2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        g_b2c[b] = (uint16_t)(byte_is_printable(b) ? b : 256 + n++);
        g_c2b[g_b2c[b]] = (int16_t)b;
    }
}

uint32_t tok_byte_to_cp(uint8_t b) {
    pthread_once(&g_map_once, byte_map_init);
    return g_b2c[b];
}

int tok_cp_to_byte(uint32_t cp) {
    pthread_once(&g_map_once, byte_map_init);
    return cp < 256 + 68 ? g_c2b[cp] : -1;
}

// ---------------------------------------------------------------------------
// Vocabulary

int tok_alloc_vocab(tok_t *t, int n_vocab, size_t blob_bytes) {
    t->n_vocab = n_vocab;
    t->blob = malloc(blob_bytes ? blob_bytes : 1);
    t->off = calloc((size_t)n_vocab + 1, sizeof(uint32_t));
    t->len = calloc((size_t)n_vocab + 1, sizeof(uint32_t));
    t->type = calloc((size_t)n_vocab + 1, 1);
    if (!t->blob || !t->off || !t->len || !t->type)
        return err_set(ERR_NOMEM, "tokenizer: cannot allocate a vocabulary of %d tokens (%zu bytes of text)", n_vocab,
                       blob_bytes);
    return 0;
}

static int32_t vmap_find(const tok_t *t, const char *s, size_t n) {
    if (!t->vmap) return -1;
    uint32_t m = t->vmap_cap - 1;
    for (uint32_t h = (uint32_t)tok_hash_bytes(s, n) & m;; h = (h + 1) & m) {
        uint32_t v = t->vmap[h];
        if (!v) return -1;
        int32_t id = (int32_t)v - 1;
        if (t->len[id] == n && memcmp(t->blob + t->off[id], s, n) == 0) return id;
    }
}

int32_t tok_find(const tok_t *t, const char *text, size_t len) { return vmap_find(t, text, len); }

// Builds the text -> id hash and the decoded bytes of every token.
int tok_build_vocab(tok_t *t, const char *src) {
    t->vmap_cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->vmap = calloc(t->vmap_cap, sizeof(uint32_t));
    size_t total = 0;
    for (int i = 0; i < t->n_vocab; i++)
        total += t->len[i];
    t->dec = malloc(total + 1);
    t->dec_off = calloc((size_t)t->n_vocab + 1, sizeof(uint32_t));
    t->dec_len = calloc((size_t)t->n_vocab + 1, sizeof(uint32_t));
    if (!t->vmap || !t->dec || !t->dec_off || !t->dec_len)
        return err_set(ERR_NOMEM, "%s: out of memory (vocabulary of %d)", src, t->n_vocab);
    uint32_t m = t->vmap_cap - 1;
    int dups = 0;
    size_t d = 0;
    for (int i = 0; i < t->n_vocab; i++) {
        const char *s = t->blob + t->off[i];
        size_t n = t->len[i];
        // Duplicate texts (seen in some converted GGUFs): the lowest id wins.
        if (vmap_find(t, s, n) >= 0) {
            dups++;
        } else {
            uint32_t h = (uint32_t)tok_hash_bytes(s, n) & m;
            while (t->vmap[h])
                h = (h + 1) & m;
            t->vmap[h] = (uint32_t)i + 1;
        }
        // Decoded form: byte-level chars back to bytes. Control / user-defined
        // tokens are raw text; a char outside the byte alphabet is kept as is.
        t->dec_off[i] = (uint32_t)d;
        int raw = t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER;
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            int l = utf8_next((const uint8_t *)s + k, n - k, &cp);
            int b = (!raw && l > 0) ? tok_cp_to_byte(cp) : -1;
            if (b >= 0) {
                t->dec[d++] = (char)b;
                k += (size_t)l;
            } else {
                int c = l > 0 ? l : 1;
                memcpy(t->dec + d, s + k, (size_t)c);
                d += (size_t)c;
                k += (size_t)c;
            }
        }
        t->dec_len[i] = (uint32_t)(d - t->dec_off[i]);
    }
    if (dups) log_debug("%s: %d duplicate token texts (the lowest id is used for encoding)", src, dups);
    return 0;
}

// ---------------------------------------------------------------------------
// Merges

int tok_alloc_merges(tok_t *t, int n_merges) {
    t->n_merges = n_merges;
    size_t n = (size_t)n_merges + 1;
    t->merge_l = malloc(n * sizeof(int32_t));
    t->merge_r = malloc(n * sizeof(int32_t));
    t->merge_res = malloc(n * sizeof(int32_t));
    if (!t->merge_l || !t->merge_r || !t->merge_res)
        return err_set(ERR_NOMEM, "tokenizer: cannot allocate %zu bytes for %d merges", 3 * n * sizeof(int32_t),
                       n_merges);
    return 0;
}

int tok_set_merge(tok_t *t, int i, const char *l, size_t ll, const char *r, size_t rl, const char *src,
                  const char *field) {
    int32_t a = vmap_find(t, l, ll), b = vmap_find(t, r, rl);
    if (a < 0 || b < 0)
        return err_set(ERR_INPUT, "%s: %s[%d]: \"%.*s\" is not in the vocabulary", src, field, i,
                       (int)(a < 0 ? ll : rl), a < 0 ? l : r);
    char stack[512];
    char *cat = ll + rl <= sizeof stack ? stack : malloc(ll + rl);
    if (!cat) return err_set(ERR_NOMEM, "%s: out of memory", src);
    memcpy(cat, l, ll);
    memcpy(cat + ll, r, rl);
    int32_t c = vmap_find(t, cat, ll + rl);
    if (cat != stack) free(cat);
    if (c < 0)
        return err_set(ERR_INPUT, "%s: %s[%d]: the merged token \"%.*s%.*s\" is not in the vocabulary", src, field, i,
                       (int)ll, l, (int)rl, r);
    t->merge_l[i] = a;
    t->merge_r[i] = b;
    t->merge_res[i] = c;
    return 0;
}

static uint64_t pair_key(int32_t l, int32_t r) { return (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1; }

static int merge_rank(const tok_t *t, int32_t l, int32_t r) {
    uint64_t k = pair_key(l, r);
    uint32_t m = t->mmap_cap - 1;
    for (uint32_t h = (uint32_t)tok_hash_bytes(&k, 8) & m;; h = (h + 1) & m) {
        if (t->mmap_key[h] == 0) return -1;
        if (t->mmap_key[h] == k) return (int)t->mmap_val[h];
    }
}

// ---------------------------------------------------------------------------
// Pre-tokenizer passes

int tok_add_pass(tok_t *t, const char *re) {
    if (t->n_pass >= TOK_MAX_PASSES)
        return err_set(ERR_UNSUP, "tokenizer: more than %d pre-tokenizer regex passes", TOK_MAX_PASSES);
    t->pass_src[t->n_pass] = tok_strndup(re, strlen(re));
    if (!t->pass_src[t->n_pass]) return err_set(ERR_NOMEM, "out of memory");
    t->n_pass++;
    return 0;
}

const char *tok_pre_name(tok_pre_t p) {
    switch (p) {
    case TOK_PRE_GPT2: return "gpt2";
    case TOK_PRE_SMOLLM: return "smollm";
    case TOK_PRE_LLAMA3: return "llama-bpe";
    case TOK_PRE_QWEN2: return "qwen2";
    default: return "custom";
    }
}

int tok_set_pre_family(tok_t *t, tok_pre_t p) {
    t->pre = p;
    switch (p) {
    case TOK_PRE_SMOLLM: TRY(tok_add_pass(t, TOK_RE_DIGIT)); return tok_add_pass(t, TOK_RE_GPT2);
    case TOK_PRE_GPT2: return tok_add_pass(t, TOK_RE_GPT2);
    case TOK_PRE_LLAMA3: return tok_add_pass(t, TOK_RE_LLAMA3);
    case TOK_PRE_QWEN2: return tok_add_pass(t, TOK_RE_QWEN2);
    default: return 0;
    }
}

// HF `tokenizers` runs these regexes in Oniguruma, where \s is Unicode
// White_Space; PCRE2 with UCP also counts U+180E (MONGOLIAN VOWEL SEPARATOR,
// a format char since Unicode 6.3) as space. To give the same pieces, \s and
// \S are spelled out as the White_Space list before compiling. (\S inside a
// class, which no known tokenizer uses, is left to PCRE2.)
#define WS_LIST "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static char *ws_rewrite(const char *re) {
    size_t n = strlen(re);
    char *out = malloc(n * (sizeof WS_LIST + 4) + 1);
    if (!out) return NULL;
    size_t k = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[i + 1];
            const char *rep = NULL;
            if (d == 's') rep = in_class ? WS_LIST : "[" WS_LIST "]";
            if (d == 'S' && !in_class) rep = "[^" WS_LIST "]";
            if (rep) {
                memcpy(out + k, rep, strlen(rep));
                k += strlen(rep);
            } else {
                out[k++] = c;
                out[k++] = d;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[k++] = c;
            // a ']' right after '[' or '[^' is a literal
            if (i + 1 < n && re[i + 1] == '^') out[k++] = re[++i];
            if (i + 1 < n && re[i + 1] == ']') out[k++] = re[++i];
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && re[i + 1] == ':') { // [:alpha:]
            const char *e = strstr(re + i + 2, ":]");
            size_t l = e ? (size_t)(e - (re + i)) + 2 : 1;
            memcpy(out + k, re + i, l);
            k += l;
            i += l - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        out[k++] = c;
    }
    out[k] = 0;
    return out;
}

// Compiles every pass: UTF + UCP so \p{L}, \s, ... are Unicode-aware, and
// MATCH_INVALID_UTF so invalid bytes act as barriers that no item matches (they
// end up in gap pieces, bytes preserved) and the subject is not re-validated on
// every call (which would make the match loop quadratic).
static int compile_passes(tok_t *t, const char *src) {
    for (int i = 0; i < t->n_pass; i++) {
        int ec;
        PCRE2_SIZE eo;
        char *pat = ws_rewrite(t->pass_src[i]);
        if (!pat) return err_set(ERR_NOMEM, "%s: out of memory", src);
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        free(pat);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return err_set(ERR_INPUT, "%s: pre-tokenizer regex \"%s\": %s (at offset %zu of its compiled form)", src,
                           t->pass_src[i], (const char *)msg, (size_t)eo);
        }
        // JIT is an optimisation only; the interpreter gives the same matches.
        if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) != 0) log_debug("%s: PCRE2 JIT unavailable", src);
        t->pass_re[i] = re;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Build: merge hash, byte tokens, added tokens, passes, chat family

static int added_cmp(const void *a, const void *b, void *ctx) {
    const tok_t *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint8_t fx = (uint8_t)t->blob[t->off[x]], fy = (uint8_t)t->blob[t->off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (t->len[x] != t->len[y]) return t->len[x] > t->len[y] ? -1 : 1; // longest first
    return x < y ? -1 : x > y;
}

int tok_build(tok_t *t, const char *src) {
    t->mmap_cap = pow2_at_least((uint64_t)t->n_merges * 2);
    t->mmap_key = calloc(t->mmap_cap, sizeof(uint64_t));
    t->mmap_val = calloc(t->mmap_cap, sizeof(uint32_t));
    if (!t->mmap_key || !t->mmap_val) return err_set(ERR_NOMEM, "%s: out of memory (merges)", src);
    uint32_t m = t->mmap_cap - 1;
    for (int i = 0; i < t->n_merges; i++) {
        // BPE never makes a control token (HF's model vocab has none): a merge
        // into one, in a crafted file, is left out (found by fuzz_tokenizer, as
        // ignore_merges taking a whole piece spelling one).
        if (t->type[t->merge_res[i]] == TOK_CONTROL) continue;
        uint64_t k = pair_key(t->merge_l[i], t->merge_r[i]);
        uint32_t h = (uint32_t)tok_hash_bytes(&k, 8) & m;
        while (t->mmap_key[h] && t->mmap_key[h] != k)
            h = (h + 1) & m;
        if (t->mmap_key[h]) continue; // a repeated merge keeps its first (lowest) rank
        t->mmap_key[h] = k;
        t->mmap_val[h] = (uint32_t)i;
    }

    for (int b = 0; b < 256; b++) {
        char u[4];
        int l = utf8_put(tok_byte_to_cp((uint8_t)b), u);
        t->byte_tok[b] = vmap_find(t, u, (size_t)l);
        if (t->byte_tok[b] >= 0 && t->type[t->byte_tok[b]] == TOK_CONTROL) t->byte_tok[b] = -1;
    }

    // Added tokens: control and user-defined ones, non-empty.
    t->added = malloc(((size_t)t->n_vocab + 1) * sizeof(int32_t));
    if (!t->added) return err_set(ERR_NOMEM, "%s: out of memory", src);
    t->n_added = 0;
    for (int i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER) && t->len[i] > 0) t->added[t->n_added++] = i;
    qsort_r(t->added, (size_t)t->n_added, sizeof(int32_t), added_cmp, t);
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < t->n_added && (uint8_t)t->blob[t->off[t->added[j]]] < b)
            j++;
        t->added_first[b] = j;
    }

    TRY(compile_passes(t, src));
    if (pthread_mutex_init(&t->cache.mu, NULL) != 0) return err_set(ERR_RUNTIME, "%s: pthread_mutex_init", src);
    tok_chat_detect(t);
    t->loaded = 1;
    return 0;
}

static void cache_free(tok_cache_t *c);

void tok_free(tok_t *t) {
    if (!t) return;
    free(t->blob), free(t->off), free(t->len), free(t->dec), free(t->dec_off), free(t->dec_len);
    free(t->type), free(t->vmap);
    free(t->merge_l), free(t->merge_r), free(t->merge_res), free(t->mmap_key), free(t->mmap_val);
    free(t->added);
    for (int i = 0; i < TOK_MAX_PASSES; i++) {
        free(t->pass_src[i]);
        if (t->pass_re[i]) pcre2_code_free(t->pass_re[i]);
    }
    free(t->chat_template), free(t->chat_system);
    cache_free(&t->cache);
    if (t->loaded) pthread_mutex_destroy(&t->cache.mu);
    memset(t, 0, sizeof *t);
}

// ---------------------------------------------------------------------------
// Word cache: piece bytes -> ids. Shared by threads behind a mutex; cleared
// when it grows past a bound so a long-running process stays bounded.

struct tok_cache_ent {
    uint64_t h;
    size_t key_off, ids_off;
    uint32_t key_len, ids_n;
};

#define CACHE_MAX_ENTRIES (1u << 20)

static void cache_free(tok_cache_t *c) {
    free(c->slot), free(c->ent), free(c->keys), free(c->ids);
    c->slot = NULL, c->ent = NULL, c->keys = NULL, c->ids = NULL;
    c->cap = c->n = 0;
    c->keys_len = c->keys_cap = c->ids_len = c->ids_cap = 0;
}

// Appends the cached ids of the piece to out; returns 1 if found.
static int cache_get(tok_cache_t *c, uint64_t h, const char *p, size_t n, int32_t **out, int *no, int *cap_o);

static int push_ids(int32_t **v, int *n, int *cap, const int32_t *ids, int k) {
    if (k == 0) return 0; // (*v may still be NULL: no pointer arithmetic on it; found by fuzz_tokenizer)
    if (*n + k > *cap) {
        int nc = *cap ? *cap : 256;
        while (nc < *n + k)
            nc *= 2;
        int32_t *nv = realloc(*v, (size_t)nc * sizeof(int32_t));
        if (!nv) return err_set(ERR_NOMEM, "tokenizer: out of memory (%d ids)", nc);
        *v = nv, *cap = nc;
    }
    memcpy(*v + *n, ids, (size_t)k * sizeof(int32_t));
    *n += k;
    return 0;
}

static int cache_get(tok_cache_t *c, uint64_t h, const char *p, size_t n, int32_t **out, int *no, int *cap_o) {
    int found = 0, rc = 0;
    pthread_mutex_lock(&c->mu);
    if (c->cap) {
        uint32_t m = c->cap - 1;
        for (uint32_t s = (uint32_t)h & m; c->slot[s]; s = (s + 1) & m) {
            struct tok_cache_ent *e = &c->ent[c->slot[s] - 1];
            if (e->h == h && e->key_len == n && memcmp(c->keys + e->key_off, p, n) == 0) {
                rc = push_ids(out, no, cap_o, c->ids + e->ids_off, (int)e->ids_n);
                found = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc < 0 ? rc : found;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t nc = *cap ? *cap : 4096;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return 0;
    *p = np, *cap = nc;
    return 1;
}

// Best effort: a failed allocation just leaves the piece uncached.
static void cache_put(tok_cache_t *c, uint64_t h, const char *p, size_t n, const int32_t *ids, int k) {
    pthread_mutex_lock(&c->mu);
    if (c->n >= CACHE_MAX_ENTRIES) { // reset (keeps the buffers)
        memset(c->slot, 0, c->cap * sizeof(uint32_t));
        c->n = 0, c->keys_len = 0, c->ids_len = 0;
    }
    if ((uint64_t)(c->n + 1) * 2 > c->cap) {
        uint32_t nc = c->cap ? c->cap * 2 : 4096;
        uint32_t *ns = calloc(nc, sizeof(uint32_t));
        struct tok_cache_ent *ne = realloc(c->ent, (size_t)(nc / 2) * sizeof *ne);
        if (!ns || !ne) {
            free(ns);
            if (ne) c->ent = ne;
            goto out;
        }
        c->ent = ne;
        for (uint32_t i = 0; i < c->n; i++) {
            uint32_t s = (uint32_t)c->ent[i].h & (nc - 1);
            while (ns[s])
                s = (s + 1) & (nc - 1);
            ns[s] = i + 1;
        }
        free(c->slot);
        c->slot = ns, c->cap = nc;
    }
    size_t kc = c->keys_cap, ic = c->ids_cap;
    if (!grow((void **)&c->keys, &kc, c->keys_len + n + 1, 1)) goto out;
    c->keys_cap = kc;
    if (!grow((void **)&c->ids, &ic, c->ids_len + (size_t)k + 1, sizeof(int32_t))) goto out;
    c->ids_cap = ic;
    struct tok_cache_ent *e = &c->ent[c->n];
    e->h = h, e->key_off = c->keys_len, e->key_len = (uint32_t)n, e->ids_off = c->ids_len, e->ids_n = (uint32_t)k;
    memcpy(c->keys + c->keys_len, p, n);
    c->keys_len += n;
    memcpy(c->ids + c->ids_len, ids, (size_t)k * sizeof(int32_t));
    c->ids_len += (size_t)k;
    uint32_t m = c->cap - 1, s = (uint32_t)h & m;
    while (c->slot[s])
        s = (s + 1) & m;
    c->slot[s] = ++c->n;
out:
    pthread_mutex_unlock(&c->mu);
}

// ---------------------------------------------------------------------------
// BPE of one pre-tokenized piece

typedef struct {
    int32_t id;
    int prev, next; // -1 at the ends; id -1 = merged away
} sym_t;

// Min-heap of (rank << 32 | left position): lowest rank first, leftmost on ties,
// which is the order of the reference "merge the lowest-ranked adjacent pair"
// loop. Stale entries are dropped when popped.
static void heap_push(uint64_t *h, int *n, uint64_t v) {
    int i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, int *n) {
    uint64_t top = h[0], v = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static void push_pair(const tok_t *t, const sym_t *s, int i, uint64_t *heap, int *nh) {
    if (i < 0 || s[i].next < 0) return;
    int r = merge_rank(t, s[i].id, s[s[i].next].id);
    if (r >= 0) heap_push(heap, nh, ((uint64_t)r << 32) | (uint32_t)i);
}

static int bpe_piece(const tok_t *t, const char *p, size_t n, int32_t **out, int *no, int *cap_o) {
    tok_cache_t *cache = (tok_cache_t *)&t->cache; // logically const: a memo of a pure function
    uint64_t h = tok_hash_bytes(p, n);
    int rc = cache_get(cache, h, p, n, out, no, cap_o);
    if (rc != 0) return rc < 0 ? rc : 0;

    // Each merge pushes at most 2 pairs after the initial n-1: 3n bounds the heap.
    sym_t sbuf[128];
    uint64_t hbuf[3 * 128];
    sym_t *s = n <= 128 ? sbuf : malloc(n * sizeof(sym_t));
    uint64_t *heap = n <= 128 ? hbuf : malloc(3 * n * sizeof(uint64_t));
    int32_t *res = NULL;
    if (!s || !heap) {
        rc = err_set(ERR_NOMEM, "tokenizer: out of memory (piece of %zu bytes)", n);
        goto done;
    }

    // ignore_merges: a piece that is one vocabulary token is taken whole.
    // (Every byte maps to a 1- or 2-byte char; longer pieces are no token.)
    if (t->ignore_merges && n <= 256) {
        char tmp[512];
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += (size_t)utf8_put(tok_byte_to_cp((uint8_t)p[i]), tmp + m);
        int32_t id = vmap_find(t, tmp, m);
        if (id >= 0 && t->type[id] != TOK_CONTROL) { // control tokens come only from the added-token match
            rc = push_ids(out, no, cap_o, &id, 1);
            goto done;
        }
    }

    // One symbol per byte; a byte with no token is dropped (HF BPE without an
    // unk token does the same), or becomes unk when the model has one.
    int ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[(uint8_t)p[i]];
        if (id < 0 && t->unk_model && t->unk >= 0) id = t->unk;
        if (id < 0) continue;
        s[ns].id = id;
        s[ns].prev = ns - 1;
        s[ns].next = -1;
        if (ns > 0) s[ns - 1].next = ns;
        ns++;
    }
    int nh = 0;
    for (int i = 0; i + 1 < ns; i++)
        push_pair(t, s, i, heap, &nh);
    while (nh > 0) {
        uint64_t top = heap_pop(heap, &nh);
        int rank = (int)(top >> 32), i = (int)(uint32_t)top;
        int j = s[i].next;
        // Stale entry: the left symbol was merged away or changed, or its right
        // neighbour is no longer the pair's right part.
        if (s[i].id != t->merge_l[rank] || j < 0 || s[j].id != t->merge_r[rank]) continue;
        s[i].id = t->merge_res[rank];
        s[i].next = s[j].next;
        if (s[j].next >= 0) s[s[j].next].prev = i;
        s[j].id = -1;
        push_pair(t, s, s[i].prev, heap, &nh);
        push_pair(t, s, i, heap, &nh);
    }
    int k = 0;
    res = malloc(((size_t)ns + 1) * sizeof(int32_t));
    if (!res) {
        rc = err_set(ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (int i = ns ? 0 : -1; i >= 0; i = s[i].next)
        res[k++] = s[i].id;
    rc = push_ids(out, no, cap_o, res, k);
    if (rc == 0) cache_put(cache, h, p, n, res, k);
done:
    free(res);
    if (s != sbuf) free(s);
    if (heap != hbuf) free(heap);
    return rc;
}

// ---------------------------------------------------------------------------
// Encoding

typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    int32_t **out;
    int *n, *cap;
} enc_t;

// Splits p[0..n) with pass k (matches and the gaps between them are pieces)
// and hands every piece to pass k+1, the last to BPE.
static int run_pass(const tok_t *t, enc_t *e, int k, const char *p, size_t n) {
    if (n == 0) return 0;
    if (k == t->n_pass) return bpe_piece(t, p, n, e->out, e->n, e->cap);
    const pcre2_code *re = t->pass_re[k];
    size_t last = 0, at = 0;
    while (at <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, at, 0, e->md, e->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(ERR_RUNTIME, "tokenizer: regex pass %d (%s) failed: %s", k, t->pass_src[k],
                           (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { // empty match: skip one character, the gap goes on
            uint32_t cp;
            int l = utf8_next((const uint8_t *)p + ms, n - ms, &cp);
            at = ms + (size_t)(l > 0 ? l : 1);
            continue;
        }
        if (ms > last) TRY(run_pass(t, e, k + 1, p + last, ms - last));
        TRY(run_pass(t, e, k + 1, p + ms, me - ms));
        last = at = me;
    }
    if (last < n) TRY(run_pass(t, e, k + 1, p + last, n - last));
    return 0;
}

static int encode_text(const tok_t *t, enc_t *e, const char *p, size_t n) {
    if (n == 0) return 0;
    if (t->n_pass > 0 && !e->md) {
        e->md = pcre2_match_data_create(4, NULL);
        e->mc = pcre2_match_context_create(NULL);
        // Long runs (a megabyte of spaces for \s+(?!\S)) need more than the
        // default 32 KiB JIT stack; this one grows on demand up to 64 MiB.
        e->js = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
        if (!e->md || !e->mc || !e->js) return err_set(ERR_NOMEM, "tokenizer: out of memory (regex)");
        pcre2_jit_stack_assign(e->mc, NULL, e->js);
    }
    return run_pass(t, e, 0, p, n);
}

// 1 when any of the n bytes from i on is marked.
static int any_marked(const uint8_t *plain, size_t i, size_t n) {
    for (size_t k = 0; plain && k < n; k++)
        if (plain[i + k]) return 1;
    return 0;
}

int tok_encode_ex(const tok_t *t, const char *text, size_t len, int flags, int32_t **ids, int *n) {
    return tok_encode_marked(t, text, len, flags, NULL, ids, n);
}

int tok_encode_marked(const tok_t *t, const char *text, size_t len, int flags, const uint8_t *plain, int32_t **ids,
                      int *n) {
    *ids = NULL;
    *n = 0;
    if (!t || !t->loaded) return err_set(ERR_INPUT, "tok_encode: tokenizer not loaded");
    if (len > (size_t)INT32_MAX / 2) return err_set(ERR_INPUT, "tok_encode: text of %zu bytes is too long", len);
    int cap = 0, rc = 0;
    enc_t e = {.out = ids, .n = n, .cap = &cap};
    if ((flags & TOK_ADD_BOS) && t->add_bos && t->bos >= 0) rc = push_ids(ids, n, &cap, &t->bos, 1);
    int special = flags & TOK_SPECIAL;
    size_t seg = 0; // start of the current plain-text segment
    for (size_t i = 0; rc == 0 && i < len;) {
        uint8_t b = (uint8_t)text[i];
        int32_t hit = -1;
        for (int j = t->added_first[b]; j < t->added_first[b + 1]; j++) {
            int32_t id = t->added[j];
            if (t->len[id] > len - i || memcmp(text + i, t->blob + t->off[id], t->len[id]) != 0) continue;
            // a control token only with TOK_SPECIAL, and never out of user text
            if (t->type[id] == TOK_CONTROL && (!special || any_marked(plain, i, t->len[id]))) continue;
            hit = id; // sorted longest first
            break;
        }
        if (hit < 0) {
            i++;
            continue;
        }
        rc = encode_text(t, &e, text + seg, i - seg);
        if (rc == 0) rc = push_ids(ids, n, &cap, &hit, 1);
        i += t->len[hit];
        seg = i;
    }
    if (rc == 0) rc = encode_text(t, &e, text + seg, len - seg);
    if (rc == 0 && (flags & TOK_ADD_BOS) && t->add_eos && t->eos >= 0) rc = push_ids(ids, n, &cap, &t->eos, 1);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.mc) pcre2_match_context_free(e.mc);
    if (e.js) pcre2_jit_stack_free(e.js);
    if (rc == 0 && !*ids) { // empty result: still hand back a valid pointer
        *ids = malloc(sizeof(int32_t));
        if (!*ids) rc = err_set(ERR_NOMEM, "out of memory");
    }
    if (rc < 0) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}

int tok_encode(const tok_t *t, const char *text, size_t len, int parse_special, int32_t **ids, int *n) {
    return tok_encode_ex(t, text, len, TOK_ADD_BOS | (parse_special ? TOK_SPECIAL : 0), ids, n);
}

// ---------------------------------------------------------------------------
// Decoding

const char *tok_text(const tok_t *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->len[id];
    return t->blob + t->off[id];
}

const char *tok_bytes(const tok_t *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

int tok_is_special(const tok_t *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->type[id] == TOK_CONTROL; }

int tok_decode(const tok_t *t, const int32_t *ids, int n, int flags, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return err_set(ERR_INPUT, "tok_decode: ids[%d] = %d is out of range [0, %d)", i, (int)ids[i], t->n_vocab);
        total += t->dec_len[ids[i]];
    }
    char *o = malloc(total + 1);
    if (!o) return err_set(ERR_NOMEM, "tok_decode: out of memory (%zu bytes)", total);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if ((flags & TOK_SKIP_SPECIAL) && t->type[ids[i]] == TOK_CONTROL) continue;
        memcpy(o + k, t->dec + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        k += t->dec_len[ids[i]];
    }
    o[k] = 0;
    *out = o;
    if (len) *len = k;
    return 0;
}

// ---------------------------------------------------------------------------
// Streaming decoder

void tok_stream_init(tok_stream_t *s, const tok_t *t, int flags) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
}

void tok_stream_free(tok_stream_t *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; // U+FFFD

// Emits the complete sequences of pend + p[0..n) into s->buf; an incomplete
// valid prefix at the end is kept in pend (or replaced when final).
static int stream_push(tok_stream_t *s, const uint8_t *p, size_t n, int final, const char **out, size_t *len) {
    size_t all = (size_t)s->n_pend + n;
    size_t need = all * 3 + 4; // each byte becomes at most one U+FFFD
    if (need > s->cap) {
        char *nb = realloc(s->buf, need);
        if (!nb) return err_set(ERR_NOMEM, "tok_stream: out of memory");
        s->buf = nb, s->cap = need;
    }
    uint8_t small[64];
    uint8_t *in = all <= sizeof small ? small : malloc(all);
    if (!in) return err_set(ERR_NOMEM, "tok_stream: out of memory");
    memcpy(in, s->pend, (size_t)s->n_pend);
    if (n) memcpy(in + s->n_pend, p, n);
    s->n_pend = 0;
    size_t o = 0;
    for (size_t i = 0; i < all;) {
        int complete;
        int k = utf8_prefix(in + i, all - i, &complete);
        if (complete) {
            memcpy(s->buf + o, in + i, (size_t)k);
            o += (size_t)k, i += (size_t)k;
        } else if (k > 0 && i + (size_t)k == all && !final) {
            memcpy(s->pend, in + i, (size_t)k); // may still be completed by the next token
            s->n_pend = k;
            i = all;
        } else { // one U+FFFD per maximal invalid subpart
            memcpy(s->buf + o, REPL, 3);
            o += 3, i += (size_t)(k > 0 ? k : 1);
        }
    }
    if (in != small) free(in);
    *out = s->buf;
    *len = o;
    return 0;
}

int tok_stream_feed(tok_stream_t *s, int32_t id, const char **out, size_t *len) {
    *out = "";
    *len = 0;
    const tok_t *t = s->t;
    if (id < 0 || id >= t->n_vocab)
        return err_set(ERR_INPUT, "tok_stream_feed: id %d is out of range [0, %d)", (int)id, t->n_vocab);
    if ((s->flags & TOK_SKIP_SPECIAL) && t->type[id] == TOK_CONTROL) return 0;
    return stream_push(s, (const uint8_t *)t->dec + t->dec_off[id], t->dec_len[id], 0, out, len);
}

int tok_stream_flush(tok_stream_t *s, const char **out, size_t *len) { return stream_push(s, NULL, 0, 1, out, len); }

// ---------------------------------------------------------------------------

int tok_eot_ids(const tok_t *t, int32_t *ids, int cap) {
    int32_t c[8];
    int k = 0;
    c[k++] = t->eos;
    c[k++] = t->eot;
    c[k++] = t->eom;
    static const char *names[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>"};
    for (int i = 0; i < 4; i++)
        c[k++] = tok_find(t, names[i], strlen(names[i]));
    int m = 0;
    for (int i = 0; i < k; i++) {
        if (c[i] < 0 || c[i] >= t->n_vocab) continue;
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= c[j] == c[i];
        if (dup) continue;
        if (m < cap) ids[m] = c[i];
        m++;
    }
    return m;
}
