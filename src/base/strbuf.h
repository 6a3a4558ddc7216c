// A growable NUL-terminated text buffer for the writers that build a file in
// memory (config JSON, safetensors headers, chat prompts). Start from {0}; s
// stays NULL until the first append. A failed allocation sets oom and drops
// that append and every later one, so callers check oom once at the end; the
// caller frees s.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *s;
    size_t n, cap; // text length (s[n] is the NUL), bytes allocated
    int oom;
} strbuf_t;

void strbuf_putn(strbuf_t *b, const char *s, size_t n);
void strbuf_puts(strbuf_t *b, const char *s);
void strbuf_printf(strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// s as a JSON string literal (the one escaper of the JSON writers), escaped as Python's json.dumps(ensure_ascii=False)
// and serde_json (the safetensors reference writer) both escape: '"' and '\\'
// backslashed, \b \f \n \r \t in their short forms, the other control
// characters below 0x20 as \u00xx (lower-case hex); every other byte, UTF-8
// included, is copied as it is (the callers check UTF-8 where it matters).
void strbuf_json_str(strbuf_t *b, const char *s);

#ifdef __cplusplus
}
#endif
