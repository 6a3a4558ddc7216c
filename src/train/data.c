// The shard loader (data.h). The shards stay memory-mapped; a row is copied
// out of the concatenated stream, crossing shard boundaries where it must.
//
// The epoch's row order is a keyed pseudo-random permutation of [0, R): a
// balanced Feistel network on the smallest even number of bits b with
// 2^b >= R, applied repeatedly until the value falls in [0, R) ("cycle
// walking", a bijection of [0, R) because the network is one of [0, 2^b);
// 2^b < 4R, so under 4 rounds of walking on average). Any position maps to its
// row in O(1) with no table, so the order needs no memory and seek is exact.
//
// A mixture (dataset_mixer with several entries) is a list of sources, each a
// corpus with its own token stream (rows never cross sources) and a weight w:
// the source gives round(w R_s) rows to every epoch, R_s being its own row
// count. With w = 1 those are its rows as they are; otherwise row k of the
// source's share is row perm_s(k mod R_s) of the source, perm_s a keyed
// permutation fixed for the run (w < 1: the same random subset every epoch;
// w > 1: every row floor(w) times, plus a subset). The epoch's order shuffles
// the shares of all sources together.
#include "train/data.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "train/shard.h"

#define FEISTEL_ROUNDS 8

// A keyed permutation of [0, n) (the Feistel network of the header).
typedef struct {
    int64_t n;
    uint64_t key[FEISTEL_ROUNDS];
    int half;       // bits per Feistel half
    uint64_t hmask; // (1 << half) - 1
} perm_t;

typedef struct {
    int sh0, n_sh;    // its shards: sh[sh0 .. sh0 + n_sh)
    int64_t n_tokens; // tokens in its stream
    int64_t rows;     // R_s: rows of T+1 tokens of its own stream
    int64_t share;    // rows it gives to each epoch
    int64_t first;    // index of its first row in the epoch's row space
    double weight;
    perm_t pick; // which of its rows row k of the share is (weight != 1)
} source_t;

struct data_loader {
    data_shard_t *sh;
    int n_sh;
    int64_t *start; // [n_sh]: the offset of each shard's first token in its source's stream
    source_t *src;
    int n_src;
    int64_t n_tokens;
    int64_t rows_all; // rows of all ranks per epoch (the sum of the shares)
    int64_t rows;     // rows of this rank per epoch
    int T, rank, world;
    uint64_t seed;
    data_pos_t pos;
    perm_t order; // the row order of epoch key_epoch
    int64_t key_epoch;
};

static uint64_t mix64(uint64_t z) { // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void perm_init(perm_t *p, int64_t n, uint64_t base) {
    p->n = n;
    int b = 2;
    while (b < 64 && ((uint64_t)1 << b) < (uint64_t)n)
        b += 2;
    p->half = b / 2;
    p->hmask = ((uint64_t)1 << p->half) - 1;
    for (int i = 0; i < FEISTEL_ROUNDS; i++)
        p->key[i] = mix64(base + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
}

static uint64_t feistel(const perm_t *p, uint64_t x) {
    uint64_t l = x >> p->half, r = x & p->hmask;
    for (int i = 0; i < FEISTEL_ROUNDS; i++) {
        uint64_t t = l ^ (mix64(r ^ p->key[i]) & p->hmask);
        l = r;
        r = t;
    }
    return (l << p->half) | r;
}

static int64_t perm_apply(const perm_t *p, int64_t j) {
    uint64_t x = (uint64_t)j;
    do {
        x = feistel(p, x);
    } while (x >= (uint64_t)p->n);
    return (int64_t)x;
}

static uint64_t epoch_base(uint64_t seed, int64_t epoch) {
    return mix64(seed ^ 0x6a09e667f3bcc908ull) ^ mix64((uint64_t)epoch + 0x3c6ef372fe94f82bull);
}

static void set_keys(data_loader_t *dl, int64_t epoch) {
    perm_init(&dl->order, dl->rows_all, epoch_base(dl->seed, epoch));
    dl->key_epoch = epoch;
}

int64_t data_loader_row_at(const data_loader_t *dl, int64_t epoch, int64_t j) {
    if (epoch == dl->key_epoch) return perm_apply(&dl->order, j);
    perm_t p; // another epoch's order, without touching dl
    perm_init(&p, dl->rows_all, epoch_base(dl->seed, epoch));
    return perm_apply(&p, j);
}

// ---------------------------------------------------------------------------

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

// The *.shard files of a folder, sorted by name (malloc'ed paths).
static int list_folder(const char *dir, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return err_set(ERR_INPUT, "%s: cannot open the folder", dir);
    char **v = NULL;
    int k = 0, cap = 0, rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!ends_with(de->d_name, ".shard")) continue;
        char p[2048];
        if ((rc = fs_join(p, sizeof p, dir, de->d_name)) < 0) break;
        if (fs_is_dir(p)) continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                rc = err_set(ERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        if (!(v[k] = strdup(p)))
            rc = err_set(ERR_NOMEM, "out of memory");
        else
            k++;
    }
    closedir(d);
    if (rc == 0 && k == 0) rc = err_set(ERR_INPUT, "%s: no *.shard files in the folder", dir);
    if (rc < 0) {
        for (int i = 0; i < k; i++)
            free(v[i]);
        free(v);
        return rc;
    }
    qsort(v, (size_t)k, sizeof *v, cmp_str);
    *out = v;
    *n = k;
    return 0;
}

// Opens one source's shards (in stream order) into dl, checking each against
// tok (when given) and against the loader's first shard.
static int add_source(data_loader_t *dl, const char *const *paths, int n_paths, double weight, const tok_t *tok) {
    if (n_paths < 1) return err_set(ERR_INPUT, "data loader: no shard files");
    data_shard_t *nsh = realloc(dl->sh, (size_t)(dl->n_sh + n_paths) * sizeof *nsh);
    if (!nsh) return err_set(ERR_NOMEM, "out of memory");
    dl->sh = nsh;
    int64_t *nst = realloc(dl->start, (size_t)(dl->n_sh + n_paths) * sizeof *nst);
    if (!nst) return err_set(ERR_NOMEM, "out of memory");
    dl->start = nst;
    source_t *nsrc = realloc(dl->src, (size_t)(dl->n_src + 1) * sizeof *nsrc);
    if (!nsrc) return err_set(ERR_NOMEM, "out of memory");
    dl->src = nsrc;
    source_t *src = &dl->src[dl->n_src++];
    memset(src, 0, sizeof *src);
    src->sh0 = dl->n_sh, src->weight = weight;
    uint64_t want = tok ? tok_hash(tok) : 0;
    for (int i = 0; i < n_paths; i++) {
        data_shard_t *sh = &dl->sh[dl->n_sh];
        TRY(data_shard_open(sh, paths[i]));
        dl->n_sh++, src->n_sh++;
        const data_shard_t *s0 = &dl->sh[0];
        if (tok && (sh->tok_hash != want || sh->n_vocab != tok->n_vocab))
            return err_set(ERR_INPUT,
                           "%s: made with another tokenizer: shard tokenizer hash %016" PRIx64
                           " (vocabulary %d), the model's tokenizer %016" PRIx64 " (vocabulary %d)",
                           paths[i], sh->tok_hash, sh->n_vocab, want, tok->n_vocab);
        if (sh != s0 && (sh->tok_hash != s0->tok_hash || sh->n_vocab != s0->n_vocab))
            return err_set(ERR_INPUT,
                           "%s: tokenizer hash %016" PRIx64
                           " (vocabulary %d) differs from the first shard's %016" PRIx64
                           " (vocabulary %d): the shards of a corpus share one tokenizer",
                           paths[i], sh->tok_hash, sh->n_vocab, s0->tok_hash, s0->n_vocab);
        dl->start[dl->n_sh - 1] = src->n_tokens;
        src->n_tokens += sh->n_tokens;
    }
    return 0;
}

// Rows, shares and the row space, once every source is open.
static int finish(data_loader_t *dl, const char *label, int T, uint64_t seed, int rank, int world) {
    dl->T = T, dl->seed = seed, dl->rank = rank, dl->world = world;
    for (int i = 0; i < dl->n_src; i++) {
        source_t *s = &dl->src[i];
        s->rows = s->n_tokens > T ? (s->n_tokens - 1) / T : 0;
        s->share = s->weight == 1.0 ? s->rows : (int64_t)llround(s->weight * (double)s->rows);
        if (s->share < 1)
            return err_set(ERR_INPUT,
                           "%s: %" PRId64 " tokens make %" PRId64 " rows of %d+1 tokens; with fraction %g it gives "
                           "no row",
                           dl->sh[s->sh0].mf.path, s->n_tokens, s->rows, T, s->weight);
        s->first = dl->rows_all;
        dl->rows_all += s->share;
        dl->n_tokens += s->n_tokens;
        perm_init(&s->pick, s->rows, mix64(seed ^ 0xbb67ae8584caa73bull) ^ mix64((uint64_t)i + 0xa54ff53a5f1d36f1ull));
    }
    if (dl->rows_all < world)
        return err_set(ERR_INPUT,
                       "%s: %" PRId64 " tokens make %" PRId64 " rows of %d+1 tokens, fewer than the %d rank%s", label,
                       dl->n_tokens, dl->rows_all, T, world, world > 1 ? "s" : "");
    dl->rows = dl->rows_all / world;
    set_keys(dl, 0);
    for (int i = 0; i < dl->n_src; i++) {
        const source_t *s = &dl->src[i];
        int64_t left = s->n_tokens - 1 - s->rows * T;
        log_info("data: %s%s: %" PRId64 " tokens in %d shard%s, %" PRId64 " rows of %d+1 tokens (%" PRId64
                 " token%s after the last full window dropped)",
                 dl->sh[s->sh0].mf.path, s->n_sh > 1 ? " ..." : "", s->n_tokens, s->n_sh, s->n_sh > 1 ? "s" : "",
                 s->rows, T, left, left == 1 ? "" : "s");
        if (dl->n_src > 1)
            log_info("data:   fraction %g: %" PRId64 " rows per epoch, %.1f%% of the mixture", s->weight, s->share,
                     100.0 * (double)s->share / (double)dl->rows_all);
    }
    if (dl->rows_all % world)
        log_info("data: %d ranks take %" PRId64 " rows each per epoch; the last %" PRId64
                 " positions of each epoch's shuffled order are left out",
                 world, dl->rows, dl->rows_all % world);
    return 0;
}

static int check_args(int T, int rank, int world) {
    if (T < 1) return err_set(ERR_INPUT, "data loader: row length T = %d, expected >= 1", T);
    if (world < 1 || rank < 0 || rank >= world)
        return err_set(ERR_INPUT, "data loader: rank %d of world %d (expected 0 <= rank < world)", rank, world);
    return 0;
}

// A source given as a shard file or a folder of them.
static int add_path(data_loader_t *dl, const char *path, double weight, const tok_t *tok) {
    if (!fs_is_dir(path)) return add_source(dl, &path, 1, weight, tok);
    char **v;
    int n;
    TRY(list_folder(path, &v, &n));
    int rc = add_source(dl, (const char *const *)v, n, weight, tok);
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
    return rc;
}

int data_loader_open_mix(data_loader_t **out, const data_source_t *srcs, int n_src, const tok_t *tok, int T,
                         uint64_t seed, int rank, int world) {
    *out = NULL;
    TRY(check_args(T, rank, world));
    if (n_src < 1) return err_set(ERR_INPUT, "data loader: no sources");
    data_loader_t *dl = calloc(1, sizeof *dl);
    if (!dl) return err_set(ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int i = 0; i < n_src && rc == 0; i++) {
        if (!(srcs[i].weight > 0) || srcs[i].weight > 1e6)
            rc = err_set(ERR_INPUT, "%s: fraction %g: expected a number > 0", srcs[i].path, srcs[i].weight);
        else
            rc = add_path(dl, srcs[i].path, srcs[i].weight, tok);
    }
    if (rc == 0) rc = finish(dl, srcs[0].path, T, seed, rank, world);
    if (rc < 0) {
        data_loader_close(dl);
        return rc;
    }
    *out = dl;
    return 0;
}

int data_loader_open(data_loader_t **out, const char *path, const tok_t *tok, int T, uint64_t seed, int rank,
                     int world) {
    data_source_t src = {path, 1.0};
    return data_loader_open_mix(out, &src, 1, tok, T, seed, rank, world);
}

int data_loader_open_list(data_loader_t **out, const char *const *paths, int n_paths, const tok_t *tok, int T,
                          uint64_t seed, int rank, int world) {
    *out = NULL;
    TRY(check_args(T, rank, world));
    data_loader_t *dl = calloc(1, sizeof *dl);
    if (!dl) return err_set(ERR_NOMEM, "out of memory");
    int rc = add_source(dl, paths, n_paths, 1.0, tok);
    if (rc == 0) rc = finish(dl, n_paths > 0 ? paths[0] : "data loader", T, seed, rank, world);
    if (rc < 0) {
        data_loader_close(dl);
        return rc;
    }
    *out = dl;
    return 0;
}

int64_t data_loader_rows(const data_loader_t *dl) { return dl->rows; }
int64_t data_loader_tokens(const data_loader_t *dl) { return dl->n_tokens; }
data_pos_t data_loader_pos(const data_loader_t *dl) { return dl->pos; }

int data_loader_seek(data_loader_t *dl, data_pos_t p) {
    if (p.epoch < 0 || p.index < 0 || p.index >= dl->rows)
        return err_set(ERR_INPUT,
                       "data loader: position (epoch %" PRId64 ", row %" PRId64 ") is outside [0, %" PRId64
                       ") rows of an epoch",
                       p.epoch, p.index, dl->rows);
    dl->pos = p;
    return 0;
}

int data_loader_read_row(const data_loader_t *dl, int64_t r, int32_t *ids, int32_t *targets) {
    if (r < 0 || r >= dl->rows_all)
        return err_set(ERR_INPUT, "data loader: row %" PRId64 " outside [0, %" PRId64 ")", r, dl->rows_all);
    // the source whose share holds r: the last one starting at or before it
    int lo = 0, hi = dl->n_src - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dl->src[mid].first <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    const source_t *src = &dl->src[lo];
    int64_t k = r - src->first;
    int64_t q = src->weight == 1.0 ? k : perm_apply(&src->pick, k % src->rows); // the source's row
    int64_t g = q * dl->T, end = g + dl->T + 1;                                 // range [g, end) of the source's stream
    // its shard holding token g
    int a = src->sh0, b = src->sh0 + src->n_sh - 1;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (dl->start[mid] <= g)
            a = mid;
        else
            b = mid - 1;
    }
    for (int s = a; g < end; s++) {
        const data_shard_t *sh = &dl->sh[s];
        int64_t base = dl->start[s], next = s + 1 < src->sh0 + src->n_sh ? dl->start[s + 1] : src->n_tokens;
        int64_t stop = next < end ? next : end;
        for (; g < stop; g++) {
            int64_t t = g - q * dl->T, i = g - base; // position in the window, in the shard
            int32_t id = data_shard_token(sh, i);
            if (t < dl->T) ids[t] = id;
            if (t > 0) targets[t - 1] = data_shard_mask(sh, i) ? id : -1;
        }
    }
    return 0;
}

int data_loader_next(data_loader_t *dl, int32_t *ids, int32_t *targets) {
    if (dl->key_epoch != dl->pos.epoch) set_keys(dl, dl->pos.epoch);
    int64_t r = perm_apply(&dl->order, dl->pos.index * dl->world + dl->rank);
    TRY(data_loader_read_row(dl, r, ids, targets));
    if (++dl->pos.index == dl->rows) {
        dl->pos.epoch++;
        dl->pos.index = 0;
    }
    return 0;
}

void data_loader_close(data_loader_t *dl) {
    if (!dl) return;
    for (int i = 0; i < dl->n_sh; i++)
        data_shard_close(&dl->sh[i]);
    free(dl->sh);
    free(dl->start);
    free(dl->src);
    free(dl);
}
