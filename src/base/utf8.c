#include "base/utf8.h"

int utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Allowed range of the second byte for a lead byte (Unicode Table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF); *need = sequence length.
static int utf8_lead(uint8_t b, int *need, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (b < 0x80) return *need = 1, 1;
    if (b >= 0xC2 && b <= 0xDF) return *need = 2, 1;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return *need = 3, 1;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return *need = 4, 1;
    }
    return 0;
}

int utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    int need;
    uint8_t lo, hi;
    if (n == 0 || !utf8_lead(s[0], &need, &lo, &hi) || (size_t)need > n) return 0;
    if (need == 1) return *cp = s[0], 1;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    uint32_t c = s[0] & (0x7F >> need);
    for (int i = 1; i < need; i++)
        c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return need;
}

int utf8_prefix(const uint8_t *s, size_t n, int *complete) {
    int need;
    uint8_t lo, hi;
    *complete = 0;
    if (!utf8_lead(s[0], &need, &lo, &hi)) return 0;
    int k = 1;
    while (k < need && (size_t)k < n) {
        uint8_t c = s[k];
        int ok = k == 1 ? (c >= lo && c <= hi) : ((c & 0xC0) == 0x80);
        if (!ok) return k; // broken: s[0..k) is a maximal invalid subpart
        k++;
    }
    *complete = k == need;
    return k;
}

size_t utf8_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_next(s + i, n - i, &cp);
        if (l == 0) break;
        i += (size_t)l;
    }
    return i;
}
