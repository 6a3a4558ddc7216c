// The shard loader (data.h). The shards stay memory-mapped; a row is copied
// out of the concatenated stream, crossing shard boundaries where it must.
//
// The epoch's row order is a keyed pseudo-random permutation of [0, R): a
// balanced Feistel network on the smallest even number of bits b with
// 2^b >= R, applied repeatedly until the value falls in [0, R) ("cycle
// walking", a bijection of [0, R) because the network is one of [0, 2^b);
// 2^b < 4R, so under 4 rounds of walking on average). Any position maps to its
// row in O(1) with no table, so the order needs no memory and seek is exact.
#include "train/data.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "train/shard.h"

#define FEISTEL_ROUNDS 8

struct data_loader {
    data_shard_t *sh;
    int n_sh;
    int64_t *start; // [n_sh + 1]: the stream offset of each shard's first token
    int64_t n_tokens;
    int64_t rows_all; // rows of all ranks per epoch
    int64_t rows;     // rows of this rank per epoch
    int T, rank, world;
    uint64_t seed;
    data_pos_t pos;
    // The permutation of pos.epoch (or of whichever epoch key_epoch says).
    int64_t key_epoch;
    uint64_t key[FEISTEL_ROUNDS];
    int half;       // bits per Feistel half
    uint64_t hmask; // (1 << half) - 1
};

static uint64_t mix64(uint64_t z) { // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void set_keys(data_loader_t *dl, int64_t epoch) {
    uint64_t base = mix64(dl->seed ^ 0x6a09e667f3bcc908ull) ^ mix64((uint64_t)epoch + 0x3c6ef372fe94f82bull);
    for (int i = 0; i < FEISTEL_ROUNDS; i++)
        dl->key[i] = mix64(base + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
    dl->key_epoch = epoch;
}

static uint64_t feistel(const data_loader_t *dl, uint64_t x) {
    uint64_t l = x >> dl->half, r = x & dl->hmask;
    for (int i = 0; i < FEISTEL_ROUNDS; i++) {
        uint64_t t = l ^ (mix64(r ^ dl->key[i]) & dl->hmask);
        l = r;
        r = t;
    }
    return (l << dl->half) | r;
}

static int64_t permute(const data_loader_t *dl, int64_t j) {
    uint64_t x = (uint64_t)j;
    do {
        x = feistel(dl, x);
    } while (x >= (uint64_t)dl->rows_all);
    return (int64_t)x;
}

int64_t data_loader_row_at(const data_loader_t *dl, int64_t epoch, int64_t j) {
    if (epoch == dl->key_epoch) return permute(dl, j);
    data_loader_t tmp = *dl; // another epoch's keys, without touching dl
    set_keys(&tmp, epoch);
    return permute(&tmp, j);
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

int data_loader_open(data_loader_t **out, const char *path, const tok_t *tok, int T, uint64_t seed, int rank,
                     int world) {
    *out = NULL;
    if (!fs_is_dir(path)) return data_loader_open_list(out, &path, 1, tok, T, seed, rank, world);
    char **v;
    int n;
    TRY(list_folder(path, &v, &n));
    int rc = data_loader_open_list(out, (const char *const *)v, n, tok, T, seed, rank, world);
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
    return rc;
}

int data_loader_open_list(data_loader_t **out, const char *const *paths, int n_paths, const tok_t *tok, int T,
                          uint64_t seed, int rank, int world) {
    *out = NULL;
    if (T < 1) return err_set(ERR_INPUT, "data loader: row length T = %d, expected >= 1", T);
    if (world < 1 || rank < 0 || rank >= world)
        return err_set(ERR_INPUT, "data loader: rank %d of world %d (expected 0 <= rank < world)", rank, world);
    if (n_paths < 1) return err_set(ERR_INPUT, "data loader: no shard files");
    data_loader_t *dl = calloc(1, sizeof *dl);
    if (!dl) return err_set(ERR_NOMEM, "out of memory");
    dl->sh = calloc((size_t)n_paths, sizeof *dl->sh);
    dl->start = calloc((size_t)n_paths + 1, sizeof *dl->start);
    if (!dl->sh || !dl->start) {
        data_loader_close(dl);
        return err_set(ERR_NOMEM, "out of memory");
    }
    uint64_t want = tok ? tok_hash(tok) : 0;
    int rc = 0;
    for (int i = 0; i < n_paths && rc == 0; i++) {
        data_shard_t *s = &dl->sh[i];
        if ((rc = data_shard_open(s, paths[i])) < 0) break;
        dl->n_sh++;
        if (tok && (s->tok_hash != want || s->n_vocab != tok->n_vocab))
            rc = err_set(ERR_INPUT,
                         "%s: made with another tokenizer: shard tokenizer hash %016" PRIx64
                         " (vocabulary %d), the model's tokenizer %016" PRIx64 " (vocabulary %d)",
                         paths[i], s->tok_hash, s->n_vocab, want, tok->n_vocab);
        else if (i > 0 && (s->tok_hash != dl->sh[0].tok_hash || s->n_vocab != dl->sh[0].n_vocab))
            rc = err_set(ERR_INPUT,
                         "%s: tokenizer hash %016" PRIx64 " (vocabulary %d) differs from %s's %016" PRIx64
                         " (vocabulary %d): the shards of a corpus share one tokenizer",
                         paths[i], s->tok_hash, s->n_vocab, paths[0], dl->sh[0].tok_hash, dl->sh[0].n_vocab);
        dl->start[i + 1] = dl->start[i] + s->n_tokens;
    }
    if (rc < 0) {
        data_loader_close(dl);
        return rc;
    }
    dl->n_tokens = dl->start[dl->n_sh];
    dl->T = T, dl->seed = seed, dl->rank = rank, dl->world = world;
    dl->rows_all = dl->n_tokens > T ? (dl->n_tokens - 1) / T : 0;
    if (dl->rows_all < world) {
        rc = err_set(ERR_INPUT,
                     "%s%s: %" PRId64 " tokens make %" PRId64 " rows of %d+1 tokens, fewer than the %d rank%s",
                     paths[0], n_paths > 1 ? " ..." : "", dl->n_tokens, dl->rows_all, T, world, world > 1 ? "s" : "");
        data_loader_close(dl);
        return rc;
    }
    dl->rows = dl->rows_all / world;
    int b = 2;
    while (b < 64 && ((uint64_t)1 << b) < (uint64_t)dl->rows_all)
        b += 2;
    dl->half = b / 2;
    dl->hmask = ((uint64_t)1 << dl->half) - 1;
    set_keys(dl, 0);
    int64_t left = dl->n_tokens - 1 - dl->rows_all * T;
    log_info("data: %s%s: %" PRId64 " tokens in %d shard%s, %" PRId64 " rows of %d+1 tokens; %" PRId64
             " token%s after the last full window dropped",
             paths[0], n_paths > 1 ? " ..." : "", dl->n_tokens, dl->n_sh, dl->n_sh > 1 ? "s" : "", dl->rows_all, T,
             left, left == 1 ? "" : "s");
    if (dl->rows_all % world)
        log_info("data: %d ranks take %" PRId64 " rows each per epoch; the last %" PRId64
                 " positions of each epoch's shuffled order are left out",
                 world, dl->rows, dl->rows_all % world);
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
    int64_t g = r * dl->T, end = g + dl->T + 1; // stream range [g, end)
    // The shard holding token g: the last one starting at or before it.
    int lo = 0, hi = dl->n_sh - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dl->start[mid] <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int s = lo; g < end; s++) {
        const data_shard_t *sh = &dl->sh[s];
        int64_t base = dl->start[s], stop = dl->start[s + 1] < end ? dl->start[s + 1] : end;
        for (; g < stop; g++) {
            int64_t t = g - r * dl->T, i = g - base; // position in the window, in the shard
            int32_t id = data_shard_token(sh, i);
            if (t < dl->T) ids[t] = id;
            if (t > 0) targets[t - 1] = data_shard_mask(sh, i) ? id : -1;
        }
    }
    return 0;
}

int data_loader_next(data_loader_t *dl, int32_t *ids, int32_t *targets) {
    if (dl->key_epoch != dl->pos.epoch) set_keys(dl, dl->pos.epoch);
    int64_t r = permute(dl, dl->pos.index * dl->world + dl->rank);
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
    free(dl);
}
