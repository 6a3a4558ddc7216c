#include "base/crc32c.h"

#include <pthread.h>
#include <string.h>
#ifdef __SSE4_2__
#include <nmmintrin.h>
#endif

#ifdef __SSE4_2__
uint32_t crc32c(uint32_t crc, const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t c = ~crc;
    for (; n && ((uintptr_t)s & 7); n--)
        c = _mm_crc32_u8((uint32_t)c, *s++);
    for (; n >= 8; n -= 8, s += 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        c = _mm_crc32_u64(c, w);
    }
    for (; n; n--)
        c = _mm_crc32_u8((uint32_t)c, *s++);
    return ~(uint32_t)c;
}
#else
// Reflected polynomial 0x82F63B78, one byte at a time.
static uint32_t g_table[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        g_table[i] = c;
    }
}

uint32_t crc32c(uint32_t crc, const void *p, size_t n) {
    pthread_once(&g_once, table_init);
    const uint8_t *s = p;
    uint32_t c = ~crc;
    while (n--)
        c = g_table[(c ^ *s++) & 0xff] ^ (c >> 8);
    return ~c;
}
#endif
