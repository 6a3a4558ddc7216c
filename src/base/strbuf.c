#include "base/strbuf.h"

#include <stdlib.h>
#include <string.h>

void strbuf_putn(strbuf_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void strbuf_puts(strbuf_t *b, const char *s) { strbuf_putn(b, s, strlen(s)); }
