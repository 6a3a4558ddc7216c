#include "base/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int parse_double(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v) || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

static const char *skip_spaces(const char *s) {
    while (*s == ' ')
        s++;
    return s;
}

int parse_int_list(const char *s, int lo, int hi, int *out, int cap) {
    if (!s) return -1;
    s = skip_spaces(s);
    int bracket = *s == '[', n = 0;
    if (bracket) s = skip_spaces(s + 1);
    if (!(bracket && *s == ']')) {
        for (;;) {
            char *end;
            errno = 0;
            long long v = strtoll(s, &end, 10);
            if (end == s || errno || v < lo || v > hi || n == cap) return -1;
            out[n++] = (int)v;
            s = skip_spaces(end);
            if (*s != ',') break;
            s = skip_spaces(s + 1);
        }
    }
    if (bracket) {
        if (*s != ']') return -1;
        s = skip_spaces(s + 1);
    }
    return *s ? -1 : n;
}
