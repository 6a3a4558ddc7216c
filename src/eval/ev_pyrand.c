#include "eval/ev_pyrand.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void init_genrand(ev_mt_t *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < 624; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->i = 624;
}

static void init_by_array(ev_mt_t *r, const uint32_t *key, int n) {
    init_genrand(r, 19650218u);
    int i = 1, j = 0;
    for (int k = 624 > n ? 624 : n; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        i++, j++;
        if (i >= 624) r->mt[0] = r->mt[623], i = 1;
        if (j >= n) j = 0;
    }
    for (int k = 623; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        i++;
        if (i >= 624) r->mt[0] = r->mt[623], i = 1;
    }
    r->mt[0] = 0x80000000u;
    r->i = 624;
}

void ev_py_seed(ev_mt_t *r, uint64_t seed) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    init_by_array(r, key, key[1] ? 2 : 1);
}

void ev_np_seed(ev_mt_t *r, uint32_t seed) { init_genrand(r, seed); }

uint32_t ev_mt_u32(ev_mt_t *r) {
    if (r->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (r->mt[k] & 0x80000000u) | (r->mt[(k + 1) % 624] & 0x7fffffffu);
            r->mt[k] = r->mt[(k + 397) % 624] ^ (y >> 1) ^ (y & 1 ? 0x9908b0dfu : 0);
        }
        r->i = 0;
    }
    uint32_t y = r->mt[r->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double ev_py_random(ev_mt_t *r) {
    uint32_t a = ev_mt_u32(r) >> 5, b = ev_mt_u32(r) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

// Words fill the integer from the least significant one up; the top word,
// when partial, is shifted right (CPython's random_getrandbits).
uint64_t ev_py_getrandbits(ev_mt_t *r, int k) {
    if (k <= 32) return ev_mt_u32(r) >> (32 - k);
    uint64_t lo = ev_mt_u32(r);
    uint64_t hi = ev_mt_u32(r) >> (64 - k);
    return lo | hi << 32;
}

void ev_py_getrandbits128(ev_mt_t *r, uint64_t *lo, uint64_t *hi) {
    uint64_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = ev_mt_u32(r);
    *lo = w[0] | w[1] << 32;
    *hi = w[2] | w[3] << 32;
}

uint64_t ev_py_randbelow(ev_mt_t *r, uint64_t n) {
    int k = 0;
    while (k < 64 && (n >> k))
        k++; // bit_length
    uint64_t v = ev_py_getrandbits(r, k);
    while (v >= n)
        v = ev_py_getrandbits(r, k);
    return v;
}

int64_t ev_py_randint(ev_mt_t *r, int64_t a, int64_t b) {
    return a + (int64_t)ev_py_randbelow(r, (uint64_t)(b - a + 1));
}

size_t ev_py_choices_index(ev_mt_t *r, size_t n) { return (size_t)floor(ev_py_random(r) * (double)n); }

void ev_py_shuffle(ev_mt_t *r, void *x, size_t n, size_t size) {
    char tmp[256], *p = x;
    if (size > sizeof tmp) abort(); // programming error: elements are pointers or small structs
    for (size_t i = n ? n - 1 : 0; i >= 1; i--) {
        size_t j = (size_t)ev_py_randbelow(r, i + 1);
        memcpy(tmp, p + i * size, size);
        memcpy(p + i * size, p + j * size, size);
        memcpy(p + j * size, tmp, size);
    }
}

int ev_py_sample(ev_mt_t *r, int64_t n, int k, int64_t *out) {
    if (k < 0 || k > n) return -1;
    int64_t setsize = 21;
    if (k > 5) setsize += (int64_t)pow(4.0, ceil(log((double)k * 3) / log(4.0)));
    if (n <= setsize) {
        int64_t *pool = malloc((size_t)(n ? n : 1) * sizeof *pool);
        if (!pool) return -1;
        for (int64_t i = 0; i < n; i++)
            pool[i] = i;
        for (int i = 0; i < k; i++) {
            int64_t j = (int64_t)ev_py_randbelow(r, (uint64_t)(n - i));
            out[i] = pool[j];
            pool[j] = pool[n - i - 1];
        }
        free(pool);
        return 0;
    }
    // The reference keeps a set of the indices taken; k is small here, so a
    // linear scan over out[0..i) is the same set.
    for (int i = 0; i < k; i++) {
        int64_t j;
        int seen;
        do {
            j = (int64_t)ev_py_randbelow(r, (uint64_t)n);
            seen = 0;
            for (int q = 0; q < i && !seen; q++)
                seen = out[q] == j;
        } while (seen);
        out[i] = j;
    }
    return 0;
}

int64_t ev_np_randint(ev_mt_t *r, int64_t low, int64_t high) {
    uint64_t rng = (uint64_t)(high - 1 - low);
    if (rng == 0) return low;
    uint64_t mask = rng;
    for (int s = 1; s < 64; s <<= 1)
        mask |= mask >> s;
    uint64_t v;
    if (rng <= 0xffffffffu) {
        do
            v = ev_mt_u32(r) & mask;
        while (v > rng);
    } else {
        do {
            uint64_t hi = ev_mt_u32(r);
            v = ((hi << 32) | ev_mt_u32(r)) & mask;
        } while (v > rng);
    }
    return low + (int64_t)v;
}

void ev_py_uuid4(ev_mt_t *r, char *out) {
    uint64_t lo, hi;
    ev_py_getrandbits128(r, &lo, &hi);
    lo &= ~(0xc000ull << 48), lo |= 0x8000ull << 48; // variant bits 63..62 = 10
    hi &= ~(0xf000ull << 0), hi |= 0x4000ull;        // version bits 79..76 = 0100
    snprintf(out, 37, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(hi >> 32), (unsigned)((hi >> 16) & 0xffff),
             (unsigned)(hi & 0xffff), (unsigned)(lo >> 48), (unsigned long long)(lo & 0xffffffffffffull));
}
