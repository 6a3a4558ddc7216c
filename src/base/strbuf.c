#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
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

void strbuf_json_str(strbuf_t *b, const char *s) {
    strbuf_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '"': strbuf_puts(b, "\\\""); break;
        case '\\': strbuf_puts(b, "\\\\"); break;
        case '\b': strbuf_puts(b, "\\b"); break;
        case '\f': strbuf_puts(b, "\\f"); break;
        case '\n': strbuf_puts(b, "\\n"); break;
        case '\r': strbuf_puts(b, "\\r"); break;
        case '\t': strbuf_puts(b, "\\t"); break;
        default:
            if (c < 0x20) {
                char u[8];
                snprintf(u, sizeof u, "\\u%04x", c);
                strbuf_puts(b, u);
            } else {
                strbuf_putn(b, s, 1);
            }
        }
    }
    strbuf_puts(b, "\"");
}

void strbuf_printf(strbuf_t *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        strbuf_putn(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    strbuf_putn(b, big, (size_t)n);
    free(big);
}
