// Strict UTF-8, as Unicode Table 3-7 defines it: no overlong forms, no
// surrogates, nothing above U+10FFFF. The safetensors reader and writer and the
// tokenizer all use these.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Encodes cp (at most U+10FFFF) into out (4 bytes of room); returns the length.
int utf8_put(uint32_t cp, char *out);
// Length (1..4) of the valid sequence that starts s[0..n), with its code point
// in *cp; 0 when s does not start with one (n == 0 included).
int utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
// Offset of the first sequence of s[0..n) that is not valid, or n when all is.
size_t utf8_check(const uint8_t *s, size_t n);
// For a decoder fed in pieces: the length of the longest prefix of s[0..n)
// (n >= 1) that is, or could still become, one valid sequence (0 when s[0]
// cannot start one); *complete says whether it is a whole sequence. A shorter
// length than the sequence needs, with bytes left after it, marks a maximal
// invalid subpart (what gets one U+FFFD).
int utf8_prefix(const uint8_t *s, size_t n, int *complete);

#ifdef __cplusplus
}
#endif
