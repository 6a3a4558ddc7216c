#include "serve/stop.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int srv_stop_init(srv_stop_t *st, const char *const *s, int n) {
    memset(st, 0, sizeof *st);
    if (n < 1) return 0;
    st->s = calloc((size_t)n, sizeof *st->s);
    if (!st->s) return err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!s[i] || !s[i][0]) continue;
        if (!(st->s[st->n] = strdup(s[i]))) {
            srv_stop_free(st);
            return err_set(ERR_NOMEM, "out of memory");
        }
        st->n++;
    }
    return 0;
}

void srv_stop_free(srv_stop_t *st) {
    for (int i = 0; i < st->n; i++)
        free(st->s[i]);
    free(st->s);
    free(st->pend.s);
    memset(st, 0, sizeof *st);
}

int srv_stop_oom(const srv_stop_t *st) { return st->pend.oom; }

// Length of the longest proper suffix of p[0..n) that is a prefix of a stop string.
static size_t held_suffix(const srv_stop_t *st, const char *p, size_t n) {
    size_t best = 0;
    for (int i = 0; i < st->n; i++) {
        size_t L = strlen(st->s[i]);
        size_t k = L - 1 < n ? L - 1 : n; // a whole match was looked for already
        for (; k > best; k--)
            if (!memcmp(p + n - k, st->s[i], k)) break;
        if (k > best) best = k;
    }
    return best;
}

int srv_stop_feed(srv_stop_t *st, const char *text, size_t n, strbuf_t *out) {
    if (st->n == 0) {
        strbuf_putn(out, text, n);
        return 0;
    }
    strbuf_putn(&st->pend, text, n);
    if (st->pend.oom) return 0;
    const char *p = st->pend.s ? st->pend.s : "";
    size_t len = st->pend.n;
    // The earliest stop string in the held text (what was handed on before
    // never held a whole or partial one: that part was kept here).
    const char *first = NULL;
    for (int i = 0; i < st->n; i++) {
        const char *f = memmem(p, len, st->s[i], strlen(st->s[i]));
        if (f && (!first || f < first)) first = f;
    }
    if (first) {
        strbuf_putn(out, p, (size_t)(first - p));
        st->pend.n = 0;
        return 1;
    }
    size_t keep = held_suffix(st, p, len);
    strbuf_putn(out, p, len - keep);
    memmove(st->pend.s, p + len - keep, keep);
    st->pend.n = keep;
    st->pend.s[keep] = 0;
    return 0;
}

void srv_stop_flush(srv_stop_t *st, strbuf_t *out) {
    if (st->pend.n) strbuf_putn(out, st->pend.s, st->pend.n);
    st->pend.n = 0;
}
