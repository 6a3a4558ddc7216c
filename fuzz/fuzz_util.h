// Pieces shared by the libFuzzer targets of the text formats (config,
// recipe, tokenizer): inputs made of several files separated by NUL bytes,
// and in-memory files (memfd) that the readers open by path, exactly as a
// file on disk. Static: each target is its own program.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"

#define FUZZ_MAX_PARTS 3

// The input cut at its first FUZZ_MAX_PARTS - 1 NUL bytes: part[i] is a
// malloc'ed NUL-terminated copy of piece i (len[i] bytes), NULL when the input
// has fewer pieces. Returns how many pieces there are.
static inline int fuzz_split(const uint8_t *data, size_t size, char *part[FUZZ_MAX_PARTS], size_t len[FUZZ_MAX_PARTS]) {
    int n = 0;
    size_t at = 0;
    for (; n < FUZZ_MAX_PARTS; n++) {
        const uint8_t *nul = n + 1 < FUZZ_MAX_PARTS ? memchr(data + at, 0, size - at) : NULL;
        size_t end = nul ? (size_t)(nul - data) : size;
        len[n] = end - at;
        part[n] = malloc(len[n] + 1);
        if (!part[n]) abort();
        if (len[n]) memcpy(part[n], data + at, len[n]);
        part[n][len[n]] = 0;
        if (!nul) {
            n++;
            break;
        }
        at = end + 1;
    }
    for (int i = n; i < FUZZ_MAX_PARTS; i++)
        part[i] = NULL, len[i] = 0;
    return n;
}

static inline void fuzz_free_parts(char *part[FUZZ_MAX_PARTS]) {
    for (int i = 0; i < FUZZ_MAX_PARTS; i++)
        free(part[i]);
}

// In-memory file `slot` (0..3) holding n bytes; its path, valid until the next call for that slot.
static inline const char *fuzz_memfile(int slot, const void *data, size_t n) {
    static int fd[4] = {-1, -1, -1, -1};
    static char path[4][64];
    if (fd[slot] < 0) {
        log_set_level(LOG_QUIET);
        fd[slot] = memfd_create("fuzz", 0);
        if (fd[slot] < 0) abort();
        snprintf(path[slot], sizeof path[slot], "/proc/self/fd/%d", fd[slot]);
    }
    if (ftruncate(fd[slot], 0) != 0) abort();
    if (n && pwrite(fd[slot], data, n, 0) != (ssize_t)n) abort();
    return path[slot];
}
