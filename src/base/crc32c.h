// CRC-32C (Castagnoli), the checksum of the token shards: detects corrupted
// bytes (not tampering). Uses the SSE4.2 crc32 instruction when the build
// targets it (x86-64-v2 and later), else a table; both give the same value.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Continues a checksum: crc32c(0, a) then crc32c(that, b) == crc32c(0, a + b).
uint32_t crc32c(uint32_t crc, const void *p, size_t n);
